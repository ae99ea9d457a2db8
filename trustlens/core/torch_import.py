"""`torch` for the modules that compute on tensors: on the light install (no torch) importing
them fails with an error that names the extra to install."""

try:
    import torch
except ModuleNotFoundError as err:
    from trustlens.core.extras import missing_extra

    raise ModuleNotFoundError(missing_extra(err) or str(err), name=err.name) from err

__all__ = ["torch"]
