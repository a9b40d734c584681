"""Server and client logic exchanging typed messages; runtimes that deliver them."""

from fedbandit.federation.messages import FieldSpec, Message, MessageSchema
from fedbandit.federation.protocol import ClientLogic, ServerLogic
from fedbandit.federation.runtime import CommunicationLedger, InProcessRuntime, Runtime

__all__ = [
    "ClientLogic",
    "CommunicationLedger",
    "FieldSpec",
    "InProcessRuntime",
    "Message",
    "MessageSchema",
    "Runtime",
    "ServerLogic",
]
