"""Test-only stand-ins that let verl's own trainer (`python -m verl.trainer.main_ppo`, verl 0.9)
run on a CPU machine: a CPU device platform (`platform`) and a rollout backend on HuggingFace
`generate` (`rollout`), both put in place by `plugin`; the example's tiny model and data (`data`)
and its reward (`reward`).

verl imports `verl_cpu.plugin` in every process when `VERL_USE_EXTERNAL_MODULES=verl_cpu.plugin`
(with examples/ on PYTHONPATH). Nothing here is trustlens: the run is recorded by
`trustlens.integrations.verl`, attached with `model.external_lib` as on a GPU.
"""
