"""Test-only stand-in for vllm (see ../README.md): the names OpenRLHF imports at load time."""


class SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
