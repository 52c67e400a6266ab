"""`python -m specchat.bench` and its sections (suite.py). A program, like the chat: before any of its modules
loads torch, it sets OpenMP's wait policy the chat runs with (threads.py), so its figures are the chat's."""

from specchat.threads import set_wait_policy

set_wait_policy()
