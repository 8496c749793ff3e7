"""The CPU backend: LLVM code generation (llvmlite) for the host, threads and the object cache."""
