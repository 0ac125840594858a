"""The agent's plain-Python core: data, tools, the model interface, the offline model."""
