"""Model backends behind the `agent.model.Model` interface."""
