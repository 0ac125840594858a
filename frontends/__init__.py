"""Front ends: ways for customers to reach the agent from outside this repository.

Each talks to turns and conversations through `runtime.turns`, as `client.py`
does, rather than on its own:

    frontends.lex   the Lambda function behind an Amazon Lex V2 bot's fallback intent
    frontends.web   a web chat that streams (`python client.py web`)
"""
