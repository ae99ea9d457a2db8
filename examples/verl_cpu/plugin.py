"""verl's external module for the CPU run (`VERL_USE_EXTERNAL_MODULES=verl_cpu.plugin`): registers
the CPU platform "trustlens_cpu" (selected with `VERL_PLATFORM=trustlens_cpu`) and the rollout
name "hf_cpu" in the process that imports verl."""

from verl_cpu import platform, rollout

rollout.register()
__all__ = ["platform", "rollout"]
