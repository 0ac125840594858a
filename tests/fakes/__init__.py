"""Protocol fakes for model providers, as strict as the real services.

Each fake refuses what the real API (or the strictest chat template served
behind it) refuses, with the same status and a message in the same words, so a
test fails where a real server would. They answer from a script of replies, or
from a "brain" that reads the conversation and tools as a model would.
"""
