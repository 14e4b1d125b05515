"""``python -m ferry.controller.podagent --node NODE``: Ferry's node agent under Kubernetes."""

from ferry.controller.service import agent_main

if __name__ == "__main__":
    agent_main()
