"""`python -m trustlens.integrations.openrlhf ARGS` (trustlens.integrations.openrlhf.launch)."""

from trustlens.integrations.openrlhf.launch import main

main()
