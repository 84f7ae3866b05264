"""Lets ``python -m services.stateserver`` start a state server."""

from services.stateserver.main import main

main()
