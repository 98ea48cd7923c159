"""pydtnn_lite: data-parallel CNN training that explains its own performance."""
import os

# The model zoo lives in the repository's top-level models/ folder and is installed as
# pydtnn_lite.models. Run from a source checkout, this folder shadows any installed copy
# and has no models/ of its own, so the package also looks beside itself.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(__path__[0], "models")) and os.path.isfile(
        os.path.join(_CHECKOUT, "models", "__init__.py")):
    __path__.append(_CHECKOUT)
