"""Acceptance checks for the PH-VAE maths and model (spec ph_vae.md section 10, checks 1-3, 5, 6)."""

import numpy as np
import pytest
import scipy.linalg
import scipy.stats as st
import torch

from paperflow.ph_vae import phase_type as pt
from paperflow.ph_vae.model import HEADS, VAE, gev_log_prob, standard_student_t

F64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread():
    """One torch thread: stable timings on shared 2-core runners (spec 7)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def random_law(seed: int, n_phases: int, batch: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (alpha, rates) in series form, float64, from a seeded torch generator."""
    gen = torch.Generator().manual_seed(seed)
    shape = batch + (n_phases,)
    alpha = torch.softmax(torch.randn(shape, generator=gen, dtype=F64), dim=-1)
    rates = pt.rates_from_raw(torch.randn(shape, generator=gen, dtype=F64))
    return alpha, rates


def numpy_generator(rates: np.ndarray) -> np.ndarray:
    """Series-form sub-generator built independently of phase_type.py."""
    return np.diag(-rates) + np.diag(rates[:-1], k=1)


def official_log_density(x: np.ndarray, alpha: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """Official formula re-implemented: log(alpha expm(A x) a), x >= 1e-8, f >= 1e-12 (spec 2)."""
    a_mat = numpy_generator(rates)
    exit_rates = -a_mat @ np.ones(len(rates))
    dens = np.array([alpha @ scipy.linalg.expm(a_mat * max(xi, 1e-8)) @ exit_rates for xi in x])
    return np.log(np.maximum(dens, 1e-12))


def ph_cdf_numpy(alpha: torch.Tensor, rates: torch.Tensor):
    """CDF callable for scipy.stats.kstest, evaluated by phase_type.cdf in float64."""
    return lambda x: pt.cdf(torch.as_tensor(x, dtype=F64), alpha, rates).numpy()


def test_series_form_structure() -> None:
    rates = pt.rates_from_raw(torch.tensor([-5.0, 0.0, 3.0, -1.0], dtype=F64))
    assert torch.all(torch.diff(rates) >= 0.01) and rates[0] >= 0.01
    a_mat = pt.series_generator(rates)
    torch.testing.assert_close(a_mat @ torch.ones(4, dtype=F64) + pt.exit_vector(rates), torch.zeros(4, dtype=F64))
    assert torch.equal(pt.exit_vector(rates)[:-1], torch.zeros(3, dtype=F64))


# Check 1: closed forms.
@pytest.mark.parametrize(("n_phases", "rate"), [(5, 2.0), (3, 0.7), (1, 1.5)])
def test_erlang_and_exponential_density(n_phases: int, rate: float) -> None:
    x = np.linspace(0.01, 15.0, 300)
    alpha = torch.zeros(n_phases, dtype=F64)
    alpha[0] = 1.0
    rates = torch.full((n_phases,), rate, dtype=F64)
    log_f = pt.log_density_expm(torch.tensor(x), alpha, rates).numpy()
    reference = st.gamma(a=n_phases, scale=1.0 / rate)
    np.testing.assert_allclose(np.exp(log_f), reference.pdf(x), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(log_f, reference.logpdf(x), rtol=1e-8, atol=1e-8)
    assert pt.mean(alpha, rates).item() == pytest.approx(n_phases / rate, rel=1e-12)
    assert pt.variance(alpha, rates).item() == pytest.approx(n_phases / rate**2, rel=1e-10)


def test_exponential_special_case() -> None:
    x = torch.linspace(0.0, 10.0, 50, dtype=F64)
    rates = torch.tensor([1.5], dtype=F64)
    log_f = pt.log_density_expm(x, torch.ones(1, dtype=F64), rates).numpy()
    np.testing.assert_allclose(log_f, st.expon(scale=1 / 1.5).logpdf(x.numpy().clip(1e-8)), atol=1e-10)


def test_mean_variance_closed_form_and_sampler() -> None:
    alpha, rates = random_law(seed=3, n_phases=6)
    green = np.linalg.inv(-numpy_generator(rates.numpy()))
    mean_np = alpha.numpy() @ green @ np.ones(6)
    second_np = 2.0 * alpha.numpy() @ green @ green @ np.ones(6)
    assert pt.mean(alpha, rates).item() == pytest.approx(mean_np, rel=1e-12)
    assert pt.variance(alpha, rates).item() == pytest.approx(second_np - mean_np**2, rel=1e-10)

    n = 10**6
    draws = pt.sample(alpha.expand(n, 6), rates.expand(n, 6), torch.Generator().manual_seed(0)).numpy()
    var_np = second_np - mean_np**2
    assert abs(draws.mean() - mean_np) < 3.0 * np.sqrt(var_np / n)
    fourth_central = np.mean((draws - draws.mean()) ** 4)
    assert abs(draws.var() - var_np) < 3.0 * np.sqrt((fourth_central - draws.var() ** 2) / n)


# Check 2: two likelihood routes agree, and agree with scipy.linalg.expm.
def test_expm_and_uniformisation_agree_with_scipy() -> None:
    alpha, rates = random_law(seed=11, n_phases=8, batch=(40,))
    gen = torch.Generator().manual_seed(12)
    x = (0.05 + 3.0 * torch.rand(40, generator=gen, dtype=F64)) * pt.mean(alpha, rates)
    by_expm = pt.log_density_expm(x, alpha, rates)
    by_unif = pt.log_density_uniformisation(x, alpha, rates)
    np.testing.assert_allclose(by_expm.numpy(), by_unif.numpy(), rtol=0, atol=1e-6)
    by_scipy = np.concatenate(
        [official_log_density(x[i : i + 1].numpy(), alpha[i].numpy(), rates[i].numpy()) for i in range(40)]
    )
    np.testing.assert_allclose(by_expm.numpy(), by_scipy, rtol=0, atol=1e-9)
    np.testing.assert_allclose(by_unif.numpy(), by_scipy, rtol=0, atol=1e-6)


def test_uniformisation_refuses_silent_truncation() -> None:
    alpha, rates = random_law(seed=1, n_phases=4)
    with pytest.raises(ValueError, match="needs [0-9]+ terms"):
        pt.log_density_uniformisation(torch.tensor(500.0, dtype=F64), alpha, rates, max_terms=500)


def test_float32_matches_float64() -> None:
    alpha, rates = random_law(seed=5, n_phases=8, batch=(30,))
    x = torch.linspace(0.1, 6.0, 30, dtype=F64)
    for log_density in (pt.log_density_expm, pt.log_density_uniformisation):
        low = log_density(x.float(), alpha.float(), rates.float())
        assert low.dtype == torch.float32
        np.testing.assert_allclose(low.double().numpy(), log_density(x, alpha, rates).numpy(), atol=1e-4)


# Check 3: exact sampler against the PH CDF, with a negative control.
@pytest.mark.parametrize("seed", [21, 22, 23])
def test_sampler_matches_cdf_ks(seed: int) -> None:
    alpha, rates = random_law(seed=seed, n_phases=6)
    n = 10**5
    draws = pt.sample(alpha.expand(n, 6), rates.expand(n, 6), torch.Generator().manual_seed(seed)).numpy()
    assert st.kstest(draws, ph_cdf_numpy(alpha, rates)).pvalue > 0.01


def test_sampler_ks_negative_control() -> None:
    alpha, rates = random_law(seed=21, n_phases=6)
    other_alpha, other_rates = random_law(seed=22, n_phases=6)
    n = 10**5
    draws = pt.sample(other_alpha.expand(n, 6), other_rates.expand(n, 6), torch.Generator().manual_seed(0)).numpy()
    assert st.kstest(draws, ph_cdf_numpy(alpha, rates)).pvalue < 1e-3


# Check 5: z fixed at 0 reduces the PH-VAE to an MLE of one series-form PH law.
def direct_mle_test_loglik(train: torch.Tensor, test: torch.Tensor, n_phases: int) -> float:
    """LBFGS on (alpha logits, raw rate increments), starting where the VAE head biases start (0)."""
    logits = torch.zeros(n_phases, dtype=F64, requires_grad=True)
    raw = torch.zeros(n_phases, dtype=F64, requires_grad=True)

    def mean_loglik(data: torch.Tensor) -> torch.Tensor:
        return pt.log_density_expm(data, torch.softmax(logits, -1), pt.rates_from_raw(raw)).mean()

    opt = torch.optim.LBFGS([logits, raw], max_iter=200, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = -mean_loglik(train)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return mean_loglik(test).item()


def test_fixed_latent_vae_matches_direct_mle() -> None:
    data = st.pareto(b=2.2).rvs(3000, random_state=np.random.default_rng(0))
    train, test = torch.tensor(data[:2000]), torch.tensor(data[2000:])
    torch.manual_seed(0)
    vae = VAE(input_dim=1, latent_dim=2, decoder="ph", n_phases=8, fixed_latent=True)
    opt = torch.optim.Adam(vae.parameters(), lr=0.1)
    train32 = train.float()[:, None]
    for _ in range(300):
        opt.zero_grad()
        vae.loss(train32).backward()
        opt.step()
    vae.double()
    with torch.no_grad():
        terms = vae.elbo_terms(test[:, None])
    assert torch.all(terms["kl"] == 0)
    vae_loglik = terms["recon"].mean().item()
    mle_loglik = direct_mle_test_loglik(train, test, n_phases=8)
    assert abs(vae_loglik - mle_loglik) <= 0.01 * abs(mle_loglik)


# Check 6: side by side with the official formula on the same synthetic data and seed.
def test_log_density_matches_official_formula() -> None:
    x = st.pareto(b=2.2).rvs(500, random_state=np.random.default_rng(1))
    alpha, rates = random_law(seed=7, n_phases=8)
    ours = pt.log_density_expm(torch.tensor(x), alpha, rates).numpy()
    official = official_log_density(x, alpha.numpy(), rates.numpy())
    np.testing.assert_allclose(ours, official, rtol=1e-10, atol=1e-10)
    assert ours.sum() == pytest.approx(official.sum(), rel=1e-12)


# Decoder heads against scipy.
def head_and_hidden(name: str, out_dim: int, seed: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    head = HEADS[name](hidden=5, out_dim=out_dim).double()
    return head, torch.randn(4, 5, dtype=F64)


def scipy_law(name: str, p: dict[str, np.ndarray]):
    if name == "gauss":
        return st.norm(loc=p["loc"], scale=p["scale"])
    if name == "student_t":
        return st.t(df=p["df"], loc=p["loc"], scale=p["scale"])
    return st.genextreme(c=-p["shape"], loc=p["loc"], scale=p["scale"])


@pytest.mark.parametrize("name", ["gauss", "student_t", "gev"])
def test_head_log_prob_matches_scipy(name: str) -> None:
    head, h = head_and_hidden(name, out_dim=3, seed=0)
    with torch.no_grad():
        p = {k: v.numpy() for k, v in head.params(h).items()}
        law = scipy_law(name, p)
        x = law.rvs(random_state=np.random.default_rng(0))
        np.testing.assert_allclose(head.log_prob(h, torch.tensor(x)).numpy(), law.logpdf(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["gauss", "student_t", "gev", "ph"])
def test_head_sampler_matches_law_ks(name: str) -> None:
    head, h = head_and_hidden(name, out_dim=1, seed=1)
    h = h[:1].expand(20000, 5)
    with torch.no_grad():
        draws = head.sample(h, torch.Generator().manual_seed(2))[:, 0].numpy()
        p = {k: v[0, 0] for k, v in head.params(h[:1]).items()}
        if name == "ph":
            cdf = ph_cdf_numpy(p["alpha"], p["rates"])
        else:
            cdf = scipy_law(name, {k: v.numpy() for k, v in p.items()}).cdf
    assert st.kstest(draws, cdf).pvalue > 0.01


@pytest.mark.parametrize("df", [0.5, 3.0, 30.0])
def test_student_t_polar_sampler_ks(df: float) -> None:
    draws = standard_student_t(torch.full((10**5,), df, dtype=F64), torch.Generator().manual_seed(4)).numpy()
    assert st.kstest(draws, st.t(df).cdf).pvalue > 0.01


def test_gev_penalty_outside_support() -> None:
    loc = torch.tensor(2.0, dtype=F64, requires_grad=True)
    scale, shape = torch.tensor(0.5, dtype=F64), torch.tensor(0.5, dtype=F64)
    below = torch.tensor([0.5, 0.0], dtype=F64)  # lower end point is loc - scale / shape = 1
    log_f = gev_log_prob(below, loc, scale, shape)
    assert torch.all(torch.isfinite(log_f)) and log_f[1] < log_f[0]
    log_f.sum().backward()
    assert loc.grad < 0  # lowering the location widens the support towards the data


# VAE API.
@pytest.mark.parametrize("decoder", sorted(HEADS))
def test_vae_loss_and_sample_shapes(decoder: str) -> None:
    torch.manual_seed(0)
    vae = VAE(input_dim=3, latent_dim=2, decoder=decoder)
    x = 0.5 + 3.0 * torch.rand(16, 3)
    terms = vae.elbo_terms(x)
    assert terms["recon"].shape == (16,) and terms["kl"].shape == (16,)
    loss = vae.loss(x)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in vae.parameters() if p.grad is not None)
    draws = vae.sample(7, torch.Generator().manual_seed(0))
    assert draws.shape == (7, 3)
    assert torch.equal(draws, vae.sample(7, torch.Generator().manual_seed(0)))


def test_vae_uniformisation_likelihood_matches_expm() -> None:
    x = 0.5 + 3.0 * torch.rand(16, 2, dtype=F64)
    torch.manual_seed(0)
    by_expm = VAE(2, 2, "ph", fixed_latent=True).double().loss(x)
    torch.manual_seed(0)
    by_unif = VAE(2, 2, "ph", likelihood="uniformisation", fixed_latent=True).double().loss(x)
    assert by_unif.item() == pytest.approx(by_expm.item(), abs=1e-6)


def test_unknown_names_raise() -> None:
    with pytest.raises(ValueError, match="allowed.*gauss.*ph"):
        VAE(input_dim=1, latent_dim=2, decoder="laplace")
    with pytest.raises(ValueError, match="allowed"):
        VAE(input_dim=1, latent_dim=2, decoder="ph", likelihood="pade")
