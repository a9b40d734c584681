"""Server and client logic exchanging typed messages; runtimes that deliver them."""

from fedbandit.federation.messages import Message
from fedbandit.federation.protocol import ClientLogic, ServerLogic
from fedbandit.federation.runtime import CommunicationLedger, InProcessRuntime, Runtime

__all__ = [
    "ClientLogic",
    "CommunicationLedger",
    "InProcessRuntime",
    "Message",
    "Runtime",
    "ServerLogic",
]
