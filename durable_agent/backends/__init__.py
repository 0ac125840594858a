"""Model backends behind the `durable_agent.model.Model` interface, and the catalog
of them a worker starts with (`default_models`)."""

from __future__ import annotations

from durable_agent.model import Model, ModelCatalog


def default_models(default: str = "offline") -> ModelCatalog:
    """`offline`, `openai:<model>` (any OpenAI-compatible server), `anthropic:<model>`,
    `bedrock:<model-id>`, `sagemaker:<endpoint>`. Backends are built on first use, once
    per worker (their SDKs are imported then: they are optional extras); `default` is
    the spec of turns whose agent names none."""

    def offline(_arg: str) -> Model:
        from durable_agent.offline import OfflineModel

        return OfflineModel()

    def openai_chat(model: str) -> Model:
        from durable_agent.backends.openai_chat import OpenAIChatModel

        return OpenAIChatModel(model)

    def anthropic(spec: str) -> Model:
        from durable_agent.backends.anthropic import AnthropicModel

        return AnthropicModel.from_spec(spec)

    def bedrock(model_id: str) -> Model:
        from durable_agent.backends.bedrock import BedrockConverseModel

        return BedrockConverseModel(model_id)

    def sagemaker(endpoint: str) -> Model:
        from durable_agent.backends.sagemaker import SageMakerTextModel

        return SageMakerTextModel(endpoint)

    return ModelCatalog(
        {
            "offline": offline,
            "openai": openai_chat,
            "anthropic": anthropic,
            "bedrock": bedrock,
            "sagemaker": sagemaker,
        },
        default=default,
    )
