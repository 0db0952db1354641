"""Progress bars that suit terminals and notebooks alike: :func:`tqdm`.

In a terminal (or a plain Python process) a bar is ``tqdm``'s own text bar on stderr.  In a Jupyter
kernel ``tqdm.auto`` would draw an ipywidgets bar; a notebook executed headless (``jupyter nbconvert
--execute``, ``nbclient``, papermill) then keeps each widget's view and its state — dozens of widget
models in the file's metadata — and, wherever widgets are not rendered (GitHub, a documentation
site, an editor without the widget manager), each bar's text fallback frozen at "0%", the state it
had when it was first displayed.  So in a kernel a bar is :class:`NotebookBar` instead: one plain-text
output updated in place (an IPython display with a ``display_id``) — live while the loop runs, and in
the saved notebook the bar's last state as text ("100%|██████████| 200/200 [...]"), no widget, no
widget state.  A bar with ``leave=False`` empties its output when it closes, as it clears its line in
a terminal.
"""
from __future__ import annotations

from tqdm.std import tqdm as text_tqdm

__all__ = ["tqdm", "NotebookBar", "in_notebook_kernel"]

#: seconds between a notebook bar's updates (each is a message to the front-end)
NOTEBOOK_MININTERVAL = 0.5
#: characters of a notebook bar's line (no terminal to measure)
NOTEBOOK_NCOLS = 100


def in_notebook_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ``IPKernelApp``), where output goes to a notebook."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class _NoWrite:
    """The text stream of a :class:`NotebookBar`: the bar is shown through its display, not a stream."""

    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


class NotebookBar(text_tqdm):
    """A ``tqdm`` bar shown in a notebook as one text output updated in place (``IPython.display`` with a
    ``display_id``): what a saved notebook keeps is its last state as plain text."""

    def __init__(self, *args, **kwargs):
        self._handle = None
        kwargs.setdefault("file", _NoWrite())
        kwargs.setdefault("mininterval", NOTEBOOK_MININTERVAL)
        kwargs.setdefault("ncols", NOTEBOOK_NCOLS)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None) -> bool:
        """Show ``msg`` (default: the bar) as the text of this bar's output, creating it on first use."""
        from IPython.display import display

        text = {"text/plain": self.__str__() if msg is None else msg}
        if self._handle is None:
            if not text["text/plain"]:
                return True  # nothing shown yet, nothing to clear
            self._handle = display(text, raw=True, display_id=True)
        else:
            self._handle.update(text, raw=True)
        return True


def tqdm(*args, **kwargs) -> text_tqdm:
    """A progress bar (``tqdm``'s arguments): :class:`NotebookBar` in a Jupyter kernel, the text bar elsewhere."""
    return (NotebookBar if in_notebook_kernel() else text_tqdm)(*args, **kwargs)
