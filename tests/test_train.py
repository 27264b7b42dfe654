"""Training: schedule, parameter groups, step, evaluation, fit (budget, resume, interrupt), checkpoints."""

import dataclasses
import math
import warnings

import pytest
import torch
from torch import nn

import vit_course.loop
from vit_course import ViT
from vit_course import checkpoint as ckpt
from vit_course.batches import AUGMENT, DeviceLoader
from vit_course.data import DATASETS, load
from vit_course.device import restore_state, resume_state
from vit_course.loop import Budget, TrainConfig, amp_settings, fit, learning_rate, precision
from vit_course.recipes import RECIPES, full_config
from vit_course.train import evaluate, evaluate_flips, param_groups, train_step, warmup_cosine

from .markers import needs_data

TINY = dict(image_size=28, patch_size=7, in_channels=1, num_classes=10, dim=32, depth=1, num_heads=2,
            mlp_ratio=2.0, pool="mean", pos_embed="sincos")


@pytest.fixture(scope="module")
def mnist():
    images, labels = load("mnist", "train")
    return images[:512], labels[:512]


def mnist_loader(mnist, n=256, batch_size=64, shuffle=True):
    meta = DATASETS["mnist"]
    return DeviceLoader(mnist[0][:n], mnist[1][:n], batch_size, shuffle=shuffle, augment=AUGMENT["mnist"],
                        mean=meta["mean"], std=meta["std"], device="cpu", drop_last=shuffle, seed=3)


def test_warmup_cosine_key_steps():
    assert warmup_cosine(0, 100, 10, 1.0) == pytest.approx(0.1)  # (step + 1) / warmup: never exactly 0
    assert warmup_cosine(9, 100, 10, 1.0) == pytest.approx(1.0)
    assert warmup_cosine(10, 100, 10, 1.0) == pytest.approx(1.0)  # the decay starts at the peak
    assert warmup_cosine(55, 100, 10, 1.0) == pytest.approx(0.5)  # half way through the decay
    assert warmup_cosine(100, 100, 10, 1.0, min_lr=0.1) == pytest.approx(0.1)
    assert warmup_cosine(5, 10, 0, 2.0, 0.0) == pytest.approx(1.0 + math.cos(math.pi * 0.5))
    values = [warmup_cosine(s, 100, 10, 1.0) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_param_groups_exclude_norms_biases_and_tokens():
    model = ViT(**{**TINY, "pool": "cls", "pos_embed": "learned"})
    decay, no_decay = param_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert {"cls_token", "pos_embed", "norm.weight", "norm.bias", "head.bias", "blocks.0.attn.qkv.bias"} <= kept
    assert decayed == {"patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight",
                       "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.weight", "head.weight"}
    assert len(decayed) + len(kept) == len(names)


class Constant(nn.Module):
    """A 'model' with fixed logits: predicts class 0 always."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        logits = torch.zeros(len(x), 3)
        logits[:, 0] = 1.0 + self.w
        return logits


def test_evaluate_loss_accuracy_and_mode():
    model = Constant().train()
    batches = [(torch.zeros(4, 1), torch.tensor([0, 0, 1, 2])), (torch.zeros(2, 1), torch.tensor([0, 1]))]
    loss, acc = evaluate(model, batches)
    assert acc == pytest.approx(3 / 6)
    logp = torch.log_softmax(torch.tensor([1.0, 0.0, 0.0]), 0)
    assert loss == pytest.approx(-(3 * logp[0] + 3 * logp[1]).item() / 6, rel=1e-5)
    assert model.training  # restored
    model.eval()
    evaluate(model, batches)
    assert not model.training


class _FirstTwoColumns(nn.Module):
    """Logits of 2 classes read off row 0, columns 0 and 1: the mirror image shows it columns W-1 and W-2."""

    def forward(self, x):  # (b, 1, 1, W) -> (b, 2)
        return x[:, 0, 0, :2]


def _flip_accuracies(model, x, y):
    _, plain, flipped = evaluate_flips(model, [(x, y)])
    return plain, flipped


def test_evaluate_flips_averages_the_probabilities_of_each_image_and_its_mirror():
    model, y = _FirstTwoColumns(), torch.tensor([0, 0])
    model.weight = nn.Parameter(torch.zeros(1))  # evaluate_flips finds the device from a parameter
    # sample 1 reads logits (2, 0) -> class 0; its mirror (0, 0): probabilities (0.5, 0.5), so class 0 either way
    x = torch.tensor([[1.0, 0.5, 0.0, 3.0], [2.0, 0.0, 0.0, 0.0]]).view(2, 1, 1, 4)
    # sample 0 reads (1, 0.5): probabilities (0.62, 0.38); its mirror [3, 0, 0.5, 1] reads (3, 0): class 0 too
    assert _flip_accuracies(model, x, y) == (1.0, 1.0)
    x = torch.tensor([[1.0, 0.5, 3.0, 0.0], [2.0, 0.0, 0.0, 0.0]]).view(2, 1, 1, 4)
    # now sample 0's mirror [0, 3, 0.5, 1] reads (0, 3): (0.05, 0.95), and the sum (0.67, 1.33) says class 1
    assert _flip_accuracies(model, x, y) == (1.0, 0.5)
    assert _flip_accuracies(model, x, torch.tensor([1, 0])) == (0.5, 1.0)
    loss, acc = evaluate(model, [(x, y)])
    assert evaluate_flips(model, [(x, y)])[:2] == (loss, acc)  # the one-view numbers are evaluate's
    with pytest.raises(ValueError, match="no batches"):
        evaluate_flips(model, [])


class _FirstThreeColumns(nn.Module):
    """Logits of 3 classes read off row 0, columns 0 to 2: the mirror image shows it columns W-1 to W-3."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, x):  # (b, 1, 1, W) -> (b, 3)
        return x[:, 0, 0, :3]


def test_evaluate_flips_averages_probabilities_not_logits():
    """With two classes the two averages always pick the same class; with three they can differ. Here the image
    reads (4.94, -4.08, 1.03), probabilities (0.98, 0.00, 0.02), its mirror (-8.84, 5.75, 3.80), probabilities
    (0.00, 0.88, 0.12): their mean (0.49, 0.44, 0.07) says class 0, the mean of the logits (-1.95, 0.84, 2.42)
    class 2."""
    x = torch.tensor([4.94, -4.08, 1.03, 3.80, 5.75, -8.84]).view(1, 1, 1, 6)
    assert _flip_accuracies(_FirstThreeColumns(), x, torch.tensor([0])) == (1.0, 1.0)


@needs_data
def test_fit_reads_the_test_set_once_at_the_end_with_flips_inside_its_budget(mnist):
    budget = Budget(100.0, final_batches=2 + 3 * 4)  # the last validation pass (2 batches), the test's with flips (4)
    budget.batch_seconds = 1.0
    assert budget.left() == pytest.approx(100.0 - 14 - budget.elapsed(), abs=0.1)  # 14 batches kept aside
    runs = {}
    val, test = mnist_loader(mnist, n=64, shuffle=False), mnist_loader(mnist, n=96, shuffle=False)
    for flips in (False, True):
        torch.manual_seed(0)
        model = ViT(**TINY)
        runs[flips] = fit(model, mnist_loader(mnist, n=128, batch_size=32), val, test_loader=test,
                          epochs=2, lr=1e-3, weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0, amp="off",
                          progress=False, test_flips=flips)
    assert "flip_acc" not in runs[False]["test"] and "test_acc" not in runs[True]  # no test curve: one reading
    assert runs[True]["val_acc"] == runs[False]["val_acc"]  # the curves are the validation split's, one view
    assert runs[True]["test"]["acc"] == runs[False]["test"]["acc"] == pytest.approx(evaluate(model, test)[1], abs=1e-6)
    model.eval()
    assert runs[True]["test"]["flip_acc"] == pytest.approx(evaluate_flips(model, test)[2], abs=1e-6)
    torch.manual_seed(0)
    budget_cut = fit(ViT(**TINY), mnist_loader(mnist, n=512, batch_size=16), val, test_loader=test,
                     epochs=None, lr=1e-3, weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0, time_budget=1e-9,
                     progress=False, test_flips=True)
    assert len(budget_cut["epoch"]) == 1 and 0 <= budget_cut["test"]["flip_acc"] <= 1  # a budget's end, then test


@needs_data
def test_train_steps_lower_the_loss_on_real_mnist(mnist):
    torch.manual_seed(0)
    model = ViT(**TINY)
    optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=3e-3)
    loader = mnist_loader(mnist, n=256, batch_size=32)
    before, _ = evaluate(model, loader)
    losses = [train_step(model, x, y, optimizer, label_smoothing=0.1) for _ in range(2) for x, y in loader]
    after, acc = evaluate(model, loader)
    # the loss stays on the device, detached: reading it is the caller's choice (fit reads it about once a second)
    assert len(losses) == 16 and losses[0].shape == () and not losses[0].requires_grad
    assert model.training  # train_step leaves it in train mode
    assert after < before - 0.05 and acc > 0.15, (before, after, acc)


def _run(mnist, path, epochs=2, resume=False, interrupt_epoch=None):
    torch.manual_seed(1)
    model = ViT(**{**TINY, "depth": 2, "drop_path": 0.2})  # stochastic depth: randomness in the step
    train = mnist_loader(mnist, n=192)
    loader = train
    if interrupt_epoch is not None:
        class Interrupting:  # Ctrl-C at the start of an epoch
            def __len__(self):
                return len(train)

            def set_epoch(self, epoch):
                train.set_epoch(epoch)

            def __iter__(self):
                if train.epoch == interrupt_epoch:
                    raise KeyboardInterrupt
                return iter(train)
        loader = Interrupting()
    history = fit(model, loader, mnist_loader(mnist, n=128, shuffle=False), epochs=epochs, lr=2e-3,
                  weight_decay=0.05, warmup_epochs=0.5, label_smoothing=0.1, amp="off", checkpoint=path,
                  resume=resume, seed=5, progress=False)
    return model, history


def test_a_gpu_run_resumes_its_device_generator_and_scaler(monkeypatch, tmp_path):
    """On a GPU dropout and stochastic depth draw from the device's generator, and fp16 has a loss scale: both are
    saved with the checkpoint and restored on resume (the CUDA calls stand in for a card this machine lacks)."""
    saved, restored = torch.tensor([7, 8, 9], dtype=torch.uint8), []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": saved)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(state))
    cuda, scaler = torch.device("cuda"), torch.amp.GradScaler("cpu", init_scale=1024.0)  # cuda disables itself here
    state = resume_state(cuda, scaler)  # what fit saves for a run on a GPU
    assert torch.equal(state["cuda_rng"], saved) and state["scaler"]["scale"] == 1024.0
    assert list(resume_state(torch.device("cpu"))) == ["rng"]  # a CPU run's checkpoint is as before
    model = ViT(image_size=8, patch_size=4, in_channels=1, num_classes=2, dim=8, depth=1, num_heads=2)
    optimizer = torch.optim.AdamW(model.parameters())
    ckpt.save_checkpoint(tmp_path / "c.pt", model, optimizer=optimizer, history={}, epoch=1, step=3, seconds=1.0,
                         **state)
    fresh = torch.amp.GradScaler("cpu")
    loader = DeviceLoader(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), torch.zeros(4, dtype=torch.long), 2,
                          mean=(0.0,), std=(1.0,), device="cpu")
    state = ckpt.read_checkpoint(tmp_path / "c.pt")
    restore_state(state, cuda, fresh)  # what _start does with it on a GPU
    assert len(restored) == 1 and torch.equal(restored[0], saved) and fresh.state_dict()["scale"] == 1024.0
    restored.clear()
    restore_state(state, torch.device("cpu"))
    assert restored == []  # a GPU checkpoint resumed on the CPU: the CPU generator only
    calls = []
    monkeypatch.setattr(vit_course.loop, "restore_state", lambda state, device, scaler: calls.append((device, scaler)))
    vit_course.loop._start(tmp_path / "c.pt", model, optimizer, loader, False, fresh)
    assert calls == [(torch.device("cpu"), fresh)]  # fit's resume restores on the model's device, with its scaler


@needs_data
def test_resume_continues_where_it_stopped(mnist, tmp_path):
    whole, history = _run(mnist, tmp_path / "a.pt")
    with pytest.raises(KeyboardInterrupt):
        _run(mnist, tmp_path / "b.pt", interrupt_epoch=1)
    _, state = ckpt.load_checkpoint(tmp_path / "b.pt")
    assert state["epoch"] == 1 and len(state["history"]["epoch"]) == 1  # the finished epoch is intact
    resumed, resumed_history = _run(mnist, tmp_path / "b.pt", resume=True)
    assert resumed_history["val_acc"] == history["val_acc"]
    assert resumed_history["train_loss"] == history["train_loss"]
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@needs_data
def test_time_budget_stops_mid_epoch_and_evaluates(mnist):
    torch.manual_seed(0)
    model = ViT(**TINY)
    history = fit(model, mnist_loader(mnist, n=512, batch_size=16), mnist_loader(mnist, n=64, shuffle=False),
                  epochs=3, lr=1e-3, weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0, time_budget=1e-9,
                  progress=False)
    assert len(history["epoch"]) == 1 and 0 < history["epoch"][0] < 1  # one step, then evaluated
    assert history["lr"][0] < 1e-4  # the schedule followed the (spent) clock to its end
    assert 0.0 <= history["val_acc"][0] <= 1.0
    assert not model.training


def test_mixed_precision_follows_one_plain_rule(monkeypatch):
    """CUDA: bf16 where the card computes in it (compute capability 8.0 and up), else fp16 with a GradScaler; the
    CPU and MPS: float32 unless asked, and never fp16."""
    cpu, mps, cuda = torch.device("cpu"), torch.device("mps"), torch.device("cuda")
    assert precision("auto", cpu) == precision("auto", mps) == precision("off", cuda) == "fp32"
    assert amp_settings("auto", cpu) == amp_settings("off", cpu) == (None, None)
    autocast, scaler = amp_settings("bf16", cpu)  # a recipe may ask for it
    assert autocast.fast_dtype == torch.bfloat16 and scaler is None and precision("bf16", cpu) == "bf16"
    # a T4 (7.5) emulates bf16, and torch.cuda.is_bf16_supported() says True for it: the capability decides
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    for capability, kind in (((8, 0), "bf16"), ((9, 0), "bf16"), ((7, 5), "fp16"), ((7, 0), "fp16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert precision("auto", cuda) == kind
    for device in (cpu, mps):
        with pytest.raises(ValueError, match="'fp16' on (cpu|mps)"):
            precision("fp16", device)
    for wrong in ("fp8", "native", None):  # "native" timed a step before the rule became plain
        with pytest.raises(ValueError, match=repr(wrong)):
            amp_settings(wrong, cpu)


@needs_data
@pytest.mark.parametrize("amp", ["auto", "bf16"])
def test_fit_trains_every_step_in_the_precision_asked_for(monkeypatch, mnist, amp):
    autocast_seen = []
    real_step = vit_course.loop.train_step
    monkeypatch.setattr(vit_course.loop, "train_step", lambda *a, **k: autocast_seen.append(
        torch.is_autocast_enabled("cpu")) or real_step(*a, **k))
    fit(ViT(**TINY), mnist_loader(mnist), mnist_loader(mnist, n=128, shuffle=False), epochs=1, lr=1e-3,
        weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0, device="cpu", amp=amp, progress=False)
    assert autocast_seen == [amp == "bf16"] * 4  # every step of the epoch; "auto" stays float32 on a CPU


def test_every_recipe_trains_with_a_train_config():
    """A recipe's training settings are TrainConfig's fields (and the loader's batch size), no more."""
    for name, recipe in RECIPES.items():
        settings = {key: value for key, value in recipe["train"].items() if key != "batch_size"}
        assert TrainConfig(**settings).lr == recipe["train"]["lr"], name
    config = TrainConfig(epochs=2, lr=1e-3, weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0)
    with pytest.raises(TypeError, match="batch_size"):
        fit(ViT(**TINY), [], [], config, batch_size=64)
    for wrong in (dict(epochs=0), dict(epochs=2.5), dict(time_budget=0), dict(time_budget=float("nan"))):
        with pytest.raises(ValueError, match=f"{next(iter(wrong))} must be .*got {next(iter(wrong.values()))}"):
            dataclasses.replace(config, **wrong)


def test_fit_refuses_a_checkpoint_it_cannot_write_or_resume(tmp_path):
    config = TrainConfig(epochs=1, lr=1e-3, weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0)
    batches = [(torch.randn(2, 1, 28, 28), torch.tensor([0, 1]))]
    with pytest.raises(ValueError, match="Sequential has none"):  # before training, not after a whole epoch
        fit(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 2)), batches, batches, config,
            checkpoint=tmp_path / "c.pt", progress=False)
    ckpt.save_checkpoint(tmp_path / "model.pt", ViT(**TINY), metrics={"test_accuracy": 0.5})
    with pytest.raises(ValueError, match="finished model .*checkpoint.pt, not its model.pt"):
        fit(ViT(**TINY), batches, batches, config, checkpoint=tmp_path / "model.pt", resume=True, progress=False)


def test_fit_stops_at_a_loss_that_is_not_finite():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    nn.init.constant_(model[1].weight, float("nan"))  # every logit NaN, so the loss too
    batches = [(torch.randn(2, 1, 2, 2), torch.tensor([0, 1]))]
    with pytest.raises(FloatingPointError, match=r"loss became nan at step 0 \(lr 1.00e-03\)"):
        fit(model, batches, batches, epochs=1, lr=1e-3, weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0,
            progress=False)


def test_save_checkpoint_refuses_a_model_without_a_config(tmp_path):
    with pytest.raises(ValueError, match="keeps its constructor's arguments in .config .*got a Linear without one"):
        ckpt.save_checkpoint(tmp_path / "m.pt", nn.Linear(2, 2))
    assert not (tmp_path / "m.pt").exists()


def test_checkpoint_round_trip_weights_only(tmp_path):
    torch.manual_seed(0)
    model = ViT(**{**TINY, "stem_channels": (8,), "patch_size": 2})
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    optimizer.step()
    history = {"epoch": [1], "test_acc": [0.5]}
    ckpt.save_checkpoint(tmp_path / "m.pt", model, history=history, metrics={"test_accuracy": 0.5}, optimizer=optimizer,
                         epoch=1, rng=torch.get_rng_state())
    raw = torch.load(tmp_path / "m.pt", weights_only=True)  # only plain types inside
    assert raw["history"] == history and raw["metrics"]["test_accuracy"] == 0.5 and "optimizer" in raw
    loaded, state = ckpt.load_checkpoint(tmp_path / "m.pt")
    assert state["config"] == model.config and not loaded.training
    x = torch.randn(3, 1, 28, 28)
    model.eval()
    assert torch.equal(loaded(x), model(x))


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "m.pt"
    model = ViT(**TINY)
    ckpt.save_checkpoint(path, model, metrics={"test_accuracy": 0.1})
    before = path.read_bytes()

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(path, model, metrics={"test_accuracy": 0.9})
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path / "new.pt", model)
    assert path.read_bytes() == before  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]  # no partial or new file left


def test_bad_inputs_name_the_values(tmp_path):
    with pytest.raises(ValueError, match="'imagenet'"):
        ckpt.load_pretrained("imagenet")
    with pytest.raises(FileNotFoundError, match="nothing.pt"):
        ckpt.load_checkpoint(tmp_path / "nothing.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="other.pt"):
        ckpt.load_checkpoint(tmp_path / "other.pt")


def test_fit_refuses_a_loader_without_batches():
    meta = DATASETS["mnist"]
    images, labels = torch.zeros(64, 1, 28, 28, dtype=torch.uint8), torch.zeros(64, dtype=torch.long)
    loader = DeviceLoader(images, labels, 128, shuffle=True, mean=meta["mean"], std=meta["std"], device="cpu",
                          drop_last=True)
    model = nn.Linear(1, 1)
    with pytest.raises(ValueError, match="64 images with batch size 128"):
        fit(model, loader, loader, epochs=1, lr=1e-3, weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0,
            progress=False)


@needs_data
@pytest.mark.parametrize("name", ["mnist", "cifar10", "cifar10-plain", "cifar10-plain-basic"])
def test_shipped_checkpoint_matches_its_metrics(name):
    from vit_course.batches import loaders
    from vit_course.recipes import RECIPES

    model, state = ckpt.load_pretrained(name)
    assert state["metrics"]["recipe"] == name  # the name it ships as, also for a run trained under an older name
    assert state["metrics"].get("trained_as") == state.get("trained_as")
    assert ckpt.pretrained_path(name).stat().st_size < 4.5e6
    assert full_config(state["config"]) == full_config(RECIPES[name]["model"])  # builds what the recipe trains
    *_, test = loaders(RECIPES[name]["dataset"], 500, device="cpu", augment=False)
    metrics, flips = state["metrics"], RECIPES[name]["train"].get("test_flips", False)
    assert metrics.get("test_flips", False) == flips
    _, acc, flip_acc = evaluate_flips(model, test) if flips else (*evaluate(model, test), None)
    one_view = metrics.get("test_accuracy_one_view", metrics["test_accuracy"])
    assert abs(acc - one_view) <= 0.001, (acc, one_view)  # the targets themselves live in benchmarks/targets.py
    # a run trained before validation splits evaluated on the test set every epoch (test_acc, flip_acc); a newer one
    # reads it once, at the end (history["test"])
    test_record = state["history"].get("test") or {"acc": state["history"]["test_acc"][-1],
                                                   "flip_acc": state["history"].get("flip_acc")}
    assert test_record["acc"] == one_view
    if flips:  # the recipe's prediction: each image's probabilities averaged with its mirror image's
        assert abs(flip_acc - metrics["test_accuracy"]) <= 0.001, (flip_acc, metrics["test_accuracy"])
        assert test_record["flip_acc"] == metrics["test_accuracy"]


def test_the_first_step_pays_for_start_up_and_is_left_out_of_the_pace():
    """On a GPU the first step takes seconds (context, kernel choices) where the next take milliseconds: guessed from
    it, the final evaluation of 80 test batches would take the whole budget (the MNIST recipe stopped after one)."""
    budget = Budget(25.0, final_batches=80)
    budget.record_step(5.0)
    for _ in range(3):
        budget.record_step(0.01)
    assert budget.step_seconds == pytest.approx(0.01)
    assert budget.left() > 24


def test_a_run_that_fills_its_budget_plans_its_steps_from_its_pace():
    config = TrainConfig(epochs=None, lr=1.0, weight_decay=0.0, warmup_epochs=1, label_smoothing=0.0, min_lr=0.0)

    def lr(step, elapsed, epochs=None, seconds=100.0):  # the rate at ``step`` once ``elapsed`` seconds have passed
        budget = Budget(seconds)
        budget.started -= elapsed
        budget.batch_seconds = 0.0  # no final evaluation to set aside
        return learning_rate(dataclasses.replace(config, epochs=epochs), step, 10, budget)

    assert lr(0, 0.0) == pytest.approx(0.1)  # the warmup (10 steps) needs no pace
    assert lr(50, 25.0) == pytest.approx(warmup_cosine(50, 200, 10, 1.0))  # a quarter of the budget: 200 planned
    assert lr(100, 25.0) == pytest.approx(warmup_cosine(100, 400, 10, 1.0))  # twice as fast: twice the steps
    assert lr(20, 0.0) == pytest.approx(1.0)  # no time passed: no pace, the peak until there is one
    assert lr(199, 99.5) == pytest.approx(0.0, abs=1e-3)  # the budget's end: fully decayed
    assert lr(105, 52.5) == pytest.approx(0.5, abs=0.02)  # half way through the decay
    assert lr(30, 50.0, epochs=10) == pytest.approx(warmup_cosine(50, 100, 10, 1.0))  # the clock is further on
    assert lr(70, 50.0, epochs=10) == pytest.approx(warmup_cosine(70, 100, 10, 1.0))  # the steps are
    assert lr(70, 99.0, epochs=10, seconds=None) == warmup_cosine(70, 100, 10, 1.0)  # no budget: steps only
    # a run shorter than its warmup (10 steps): the warmup takes the first half, and the run still ends decayed
    assert lr(7, 99.5) == pytest.approx(warmup_cosine(7, 8, 4, 1.0)) and lr(7, 99.5) < 0.2  # 8 steps: warmup 4
    one_epoch = dataclasses.replace(config, epochs=1)  # no budget: a warmup as long as the run is the run's choice
    assert learning_rate(one_epoch, 3, 4, Budget()) == pytest.approx(1.0)


@needs_data
def test_epochs_none_trains_until_the_budget_is_used(mnist):
    torch.manual_seed(0)
    model = ViT(**TINY)
    loader = mnist_loader(mnist, n=128, batch_size=32)
    history = fit(model, loader, mnist_loader(mnist, n=32, shuffle=False), epochs=None, lr=1e-3, weight_decay=0.0,
                  warmup_epochs=0.5, label_smoothing=0.0, time_budget=3.0, progress=False)
    assert history["epoch"][-1] > 2  # four steps an epoch: a 3 s budget holds many epochs, and all are used
    assert history["seconds"][-1] == pytest.approx(3.0, abs=0.5)
    assert history["lr"][-1] < 0.1 * 1e-3  # it ends decayed
    with pytest.raises(ValueError, match="time_budget"):
        fit(model, loader, loader, epochs=None, lr=1e-3, weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0)


def test_an_unknown_pretrained_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match=r"'imagenet'.*mnist, cifar10, cifar10-plain"):
        ckpt.load_pretrained("imagenet")


def test_a_pretrained_name_whose_file_is_missing_says_how_to_train_it(monkeypatch):
    monkeypatch.setattr(ckpt, "PRETRAINED", (*ckpt.PRETRAINED, "mnist-big"))  # known, but no file in this copy
    with pytest.raises(FileNotFoundError, match=r"the mnist-big model does not ship with this copy of the package "
                                                r"\(no .*mnist-big.model\.pt\): train it with `python -m vit_course "
                                                r"train mnist-big`"):
        ckpt.load_pretrained("mnist-big")


def test_train_step_with_a_grad_scaler_takes_the_same_step():
    """float16 training scales the loss up and the gradients back down (GradScaler): in float32 that is the same
    step as without it, and the scaler's scale is where the step left it."""
    steps = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1)):
        torch.manual_seed(0)
        model = ViT(**TINY)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)  # its step is the gradient's size: scale shows
        x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
        loss = train_step(model, x, y, optimizer, 0.1, scaler)
        steps.append((loss, [p.detach().clone() for p in model.parameters()]))
    (loss, plain), (scaled_loss, scaled) = steps
    assert scaled_loss == pytest.approx(loss)  # the unscaled loss is returned
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, scaled, strict=True))
    assert scaler.get_scale() == 2.0 ** 11  # a finite step: the scale grows (here after every such step)


def test_fit_with_a_grad_scaler_skips_a_step_whose_gradients_overflow(monkeypatch):
    """fit's float16 path (a CUDA card's; GradScaler and float16 autocast run on the CPU too): a step with an inf
    gradient leaves the weights as they were and halves the loss scale."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    monkeypatch.setattr(vit_course.loop, "amp_settings",
                        lambda amp, device: (torch.autocast("cpu", dtype=torch.float16), scaler))
    torch.manual_seed(0)
    model = ViT(**TINY)
    before = [p.detach().clone() for p in model.parameters()]
    model.head.weight.register_hook(lambda grad: torch.full_like(grad, math.inf))  # an overflow in every step
    batches = [(torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3]))]
    history = fit(model, batches, batches, epochs=2, lr=1e-3, weight_decay=0.05, warmup_epochs=0,
                  label_smoothing=0.0, progress=False)
    assert scaler.get_scale() == 2.0 ** 8  # halved at each of the two steps
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # no step was taken
    assert math.isfinite(history["train_loss"][-1])  # the loss itself was fine: only the gradient overflowed


def strong_loader(n=32, batch_size=16):
    """Random uint8 images through every augmentation a recipe uses: crop and flip, RandAugment, CutMix or Mixup."""
    import functools

    from vit_course.augment import mix_batch
    from vit_course.batches import cifar_augment

    images = torch.randint(0, 256, (n, 3, 8, 8), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    augment = functools.partial(cifar_augment, padding=2, rand_ops=2, magnitude=9, rand_prob=0.5)
    mix = functools.partial(mix_batch, num_classes=10, cutmix=1.0, mixup=0.8, switch=0.5)
    return DeviceLoader(images, torch.arange(n) % 10, batch_size, shuffle=True, augment=augment, mix=mix,
                        mean=0.5, std=0.25, drop_last=True)


def compiled_twin(seed=0):
    """(model, AdamW with a tensor learning rate, as fit makes them for ``whole_step`` on a CPU)."""
    torch.manual_seed(seed)
    model = ViT(image_size=8, patch_size=1, in_channels=3, num_classes=10, dim=16, depth=1, num_heads=2,
                stem_channels=(8,), drop_path=0.1)
    optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=torch.tensor(1e-3), foreach=False)  # a CPU's
    return model, optimizer


def test_the_whole_step_compiles_into_two_graphs_that_take_the_eager_step():
    loader = strong_loader()
    index = loader.indices()[0]
    eager, eager_opt = compiled_twin()
    torch.manual_seed(1)  # the batch's augmentation and the model's stochastic depth draw from here
    eager_loss = train_step(eager, *loader.batch(index), eager_opt, label_smoothing=0.1)
    model, optimizer = compiled_twin()
    step = vit_course.loop.whole_step(model, optimizer, loader, label_smoothing=0.1, backend="eager")
    torch.manual_seed(1)
    with torch._dynamo.config.patch(trace_autograd_ops=True):  # explain runs each function, as its graph would
        explained = {"forward_backward": torch._dynamo.explain(step.graphs["forward_backward"])(index),
                     "update": torch._dynamo.explain(step.graphs["update"])()}
    for name, graph in explained.items():
        assert (graph.graph_count, graph.graph_break_count) == (1, 0), (
            name, [str(b.reason).splitlines()[0] for b in graph.break_reasons])
    for (name, a), b in zip(eager.named_parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), f"{name} differs after one step: the compiled step is not the eager one"
    model, optimizer = compiled_twin()
    step = vit_course.loop.whole_step(model, optimizer, loader, label_smoothing=0.1, backend="eager")
    torch.manual_seed(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = step(index)
    assert not [w for w in caught if "compile" in str(w.message)]  # no fallback to the model compiled alone
    assert loss.shape == () and torch.allclose(loss, eager_loss)
    for a, b in zip(eager.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


class Untraceable(nn.Module):
    """A model whose forward reads a value back to the host and branches on it: the compiler cannot keep one graph."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.linear(x) if x.sum().item() > -1e9 else -self.linear(x)


def test_a_whole_step_that_cannot_compile_warns_and_still_trains():
    loader = strong_loader()
    torch.manual_seed(0)
    model = Untraceable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-2), foreach=False)
    before = model.linear.weight.clone()
    step = vit_course.loop.whole_step(model, optimizer, loader, backend="eager")
    with pytest.warns(UserWarning, match="do not compile into one graph"):
        loss = step(loader.indices()[0])
    assert math.isfinite(loss.item()) and not torch.equal(before, model.linear.weight)


def test_fit_compiles_the_whole_step_where_asked(monkeypatch):
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, **{**kw, "backend": "eager"}))  # trace only
    loader, served = strong_loader(), []
    batch = loader.batch
    monkeypatch.setattr(loader, "batch", lambda index, generator=None: served.append(generator) or batch(index))
    model, _ = compiled_twin()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        val = DeviceLoader(loader.images, loader.labels, 16, mean=0.5, std=0.25)  # unmixed labels to score
        history = fit(model, loader, val, epochs=1, lr=1e-3, weight_decay=0.05, warmup_epochs=0,
                      label_smoothing=0.1, compile=True, progress=False)
    assert not [w for w in caught if "compile" in str(w.message)]  # no fallback to the model compiled alone
    assert served == [None, None]  # the epoch's 2 batches made inside the step, drawing from the global generator
    assert math.isfinite(history["train_loss"][0])
