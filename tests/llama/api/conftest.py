"""One SmolLM2 `Llama` for the API tests (creating one compiles or loads its graphs)."""
import pytest

from llama import Llama


@pytest.fixture(scope="session")
def smol(smollm2_path) -> Llama:
    return Llama(str(smollm2_path), n_ctx=1024, n_threads=2, verbose=False)
