"""A workflow that says whether it runs in the SDK's sandbox (a module of its own:
the sandbox imports a workflow's module afresh, and this one needs nothing else)."""

from temporalio import workflow


@workflow.defn(name="SandboxProbe")
class SandboxProbe:
    @workflow.run
    async def run(self) -> bool:
        return workflow.unsafe.in_sandbox()
