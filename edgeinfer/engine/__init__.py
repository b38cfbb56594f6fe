"""The engine: `Engine` (what `edgeinfer.load` returns) and the values its public methods
trade in. The server and the tools import these names from here, never a submodule."""
from .adapters import AdapterBusyError, AdapterError, UnknownAdapterError
from .constraint import ConstraintError, check_logit_bias, grammar_spec
from .engine import Engine
from .generation import DoneEvent, ErrorEvent, TokenEvent, TokenLogprob
from .reasoning import EFFORT_BUDGETS, ReasoningSpec
from .prompt_cache import CacheFileError
from .request import QueueFullError, SchedulerClosedError
from .scheduler import SlotBusyError, SlotFilesUnsupportedError
from .sampling import SamplingParams
from .tool_calls import ToolError, call_finish

__all__ = ["AdapterBusyError", "AdapterError", "UnknownAdapterError", "CacheFileError", "ConstraintError", "DoneEvent", "EFFORT_BUDGETS", "Engine", "ErrorEvent", "QueueFullError",
           "SlotBusyError", "SlotFilesUnsupportedError",
           "ReasoningSpec", "SamplingParams",
           "SchedulerClosedError", "TokenEvent", "TokenLogprob", "ToolError", "call_finish", "check_logit_bias",
           "grammar_spec"]
