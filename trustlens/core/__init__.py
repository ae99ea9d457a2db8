"""Foundations the other packages share, importing no other part of trustlens: log-space helpers
(`logspace`, numpy or torch), the checks of plain arguments (`argument_checks`) and of tensors
(`tensor_checks`), the torch import that names the extra to install when torch is missing
(`torch_import`), which extra installs a missing package (`extras`), the release (`version`),
and safe HTML and Markdown of untrusted model text (`render`). Nothing is imported at package import."""
