"""callbacks.checkpoints.ModelCheckpoint: Lightning's, with the same state key (checkpoints load in both), made once
(Lightning asks for it at every hook call)."""

from lightning.pytorch import callbacks

from callbacks.checkpoints import ModelCheckpoint


def test_the_state_key_is_lightnings_and_is_formatted_once(monkeypatch):
    settings = dict(monitor="val/acc", mode="max", every_n_epochs=1)
    ours = ModelCheckpoint(**settings)
    formatted = []
    generate = callbacks.ModelCheckpoint._generate_state_key
    monkeypatch.setattr(callbacks.ModelCheckpoint, "_generate_state_key",
                        lambda self, **kwargs: formatted.append(kwargs) or generate(self, **kwargs))
    keys = {ours.state_key for _ in range(12)}
    assert keys == {callbacks.ModelCheckpoint(**settings).state_key} and len(formatted) == 2  # ours once, Lightning's once
