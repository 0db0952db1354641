"""The one architecture registry: a registration is all that a new architecture needs for the CLI,
a run's model and save / load (zoo.architectures.registry, inference.storage.net_spec)."""
import pytest
import torch
from torch import nn

from inference import load_posterior
from inference.storage.net_spec import build_net, net_spec
from lab.cli import main
from lab.runs.model import build_model
from lab.runs.spec import RunSpec
from zoo.architectures import ARCHITECTURES, Architecture, build_architecture, register_architecture
from zoo.data import load_dataset


class TinyNet(nn.Module):
    """``input_dim -> width -> output_dim`` with a tanh; ``marked`` records the vmap option."""

    def __init__(self, input_dim, output_dim, width=3, marked=False):
        super().__init__()
        self.input_dim, self.output_dim, self.width, self.marked = input_dim, output_dim, width, marked
        self.body = nn.Linear(input_dim, width)
        self.out = nn.Linear(width, output_dim)

    def forward(self, x):
        return self.out(torch.tanh(self.body(x)))


def _build_tiny(input_dim, output_dim, hidden=None, activation=None, **kw):
    return TinyNet(input_dim, output_dim, width=3 if hidden is None else hidden[0], **kw)


def _describe_tiny(net):
    return {"input_dim": net.input_dim, "output_dim": net.output_dim, "hidden": [net.width], "marked": net.marked}


@pytest.fixture
def tiny():
    entry = register_architecture(Architecture("tiny", _build_tiny, TinyNet, _describe_tiny,
                                               vmap_options={"marked": True}, hidden_help="width (default 3)"))
    try:
        yield entry
    finally:
        ARCHITECTURES.pop("tiny")


@pytest.mark.filterwarnings("ignore:svi. failed fit:RuntimeWarning")  # 3 epochs
def test_a_registered_architecture_is_built_listed_run_saved_and_loaded(tiny, tmp_path, capsys):
    assert isinstance(build_architecture("tiny", 2, 1, hidden=[5]), TinyNet)
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    listing = " ".join(capsys.readouterr().out.split())
    assert "tiny" in listing and "tiny: width (default 3)" in listing

    data = load_dataset("toy1d")
    assert build_model(RunSpec(data="toy1d", model="tiny", stochastic="all"), data).net.marked  # its vmap option
    assert not build_model(RunSpec(data="toy1d", model="tiny", stochastic="last"), data).net.marked

    out = tmp_path / "run"
    assert main(["fit", "--data", "toy1d", "--model", "tiny", "--hidden", "4", "--epochs", "3", "--num-samples", "5",
                 "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    loaded = load_posterior(out / "posterior")  # rebuilt from the registry: no net= needed
    assert isinstance(loaded.bnn.net, TinyNet) and loaded.bnn.net.width == 4 and loaded.bnn.net.marked
    assert net_spec(loaded.bnn.net) == {"zoo": "tiny", "args": {"input_dim": 1, "output_dim": 1, "hidden": [4],
                                                                "marked": True}}


def test_a_registration_is_checked_and_an_unregistered_network_saves_as_a_user_network(tiny):
    with pytest.raises(ValueError, match="already registered"):
        register_architecture(Architecture("tiny", _build_tiny, TinyNet, _describe_tiny))
    net = TinyNet(2, 1)
    assert repr(build_net(net_spec(net))) == repr(net)
    ARCHITECTURES.pop("tiny")
    try:
        spec = net_spec(net)  # as for any class the registry does not know
        assert spec == {"user": f"{__name__}.TinyNet"}
        with pytest.raises(ValueError, match="cannot rebuild"):
            build_net(spec)
    finally:
        ARCHITECTURES["tiny"] = tiny
