"""One screen per place in the studio; the app runs each as a Textual mode so each keeps its state."""

from studio.tui.screens.chat import ChatScreen
from studio.tui.screens.exactness import ExactnessScreen
from studio.tui.screens.load import LoadScreen
from studio.tui.screens.logs import LogsScreen
from studio.tui.screens.models import ModelsScreen
from studio.tui.screens.settings import SettingsScreen
from studio.tui.screens.status import StatusScreen

SCREENS = {
    "models": ModelsScreen,
    "load": LoadScreen,
    "status": StatusScreen,
    "chat": ChatScreen,
    "exactness": ExactnessScreen,
    "logs": LogsScreen,
    "settings": SettingsScreen,
}

__all__ = ["SCREENS"]
