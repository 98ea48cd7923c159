"""Run on every rank of an emulated cluster as ``emulated_node.py FOLDER``: writes to
FOLDER/RANK.txt (rank from MPI's launcher) the rank's node index, the namespace it
runs in, the link rate and network device it was given, and whether the other node (of two)
answers on its address: 'reached' when a TCP connection is refused there (the host is up)."""
import os
import socket
import subprocess
import sys

node = int(os.environ["PYDTNN_LITE_NODE"])
namespace = subprocess.run(["ip", "netns", "identify"], capture_output=True, text=True, check=True).stdout.strip()
try:
    socket.create_connection((f"10.213.0.{2 - node}", 9), timeout=5).close()
    answer = "reached"
except ConnectionRefusedError:
    answer = "reached"
except OSError as error:
    answer = f"unreachable ({error})"
with open(os.path.join(sys.argv[1], f"{os.environ['PMI_RANK']}.txt"), "w", encoding="utf-8") as out:
    print(node, namespace, os.environ["PYDTNN_LITE_LINK_GBIT"], os.environ["FI_TCP_IFACE"], answer, file=out)
