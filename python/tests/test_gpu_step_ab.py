"""python/gpu_step_ab.py's statistics (the A/B runs themselves need a GPU): the paired difference's
mean and its 95% confidence interval from Student's t, and the table's conservative choice of
quantile between the degrees of freedom it lists."""

import importlib.util
import math
import os

# Loaded from its file: putting python/ on sys.path would make `import adaptalloc` in the other
# tests find the source folder instead of the installed package.
_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu_step_ab.py")
_SPEC = importlib.util.spec_from_file_location("gpu_step_ab", _PATH)
gpu_step_ab = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_step_ab)


def test_mean_and_half_width_follow_students_t():
    m, h = gpu_step_ab.mean_ci([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5
    # sd = sqrt(5/3), t(3) = 3.182, n = 4
    assert math.isclose(h, 3.182 * math.sqrt(5 / 3) / 2, rel_tol=1e-12)


def test_one_pair_has_no_interval():
    m, h = gpu_step_ab.mean_ci([0.7])
    assert m == 0.7 and math.isnan(h)


def test_unlisted_degrees_of_freedom_take_the_next_lower_listed_quantile():
    assert gpu_step_ab.t95(5) == 2.571
    assert gpu_step_ab.t95(11) == gpu_step_ab.t95(10) == 2.228
    assert gpu_step_ab.t95(100) == 2.042
