"""Real classical-ML models, converted to ONNX by skl2onnx (scikit-learn) and onnxmltools (LightGBM,
XGBoost), built with minirt's builder and run by minirt, against onnxruntime on the same ONNX file:
labels identical, probabilities and values within 1e-5 relative (tests/ml/conftest.py).

Every model is trained here on small synthetic data (no downloads).  A case whose converter or
training library is not installed is skipped with the package's name (they come with
``pip install minirt[dev]``).  ``python -m tests.ml.test_converted_models`` prints the table of
cases with the largest differences seen.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.ml.conftest import compare_outputs, run_minirt, run_onnxruntime

ML_OPSET = {"": 17, "ai.onnx.ml": 3}


def _need(module: str):
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install minirt[dev])")


def _data(n=240, features=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    score = x[:, 0] + 0.7 * x[:, 1] - 0.5 * x[:, 2] * x[:, 3]
    edges = np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1])
    y_class = np.digitize(score, edges)
    y_reg = (score + 0.1 * rng.normal(size=n)).astype(np.float32)
    return x, y_class, y_reg


def _skl(estimator, x, y, **options):
    _need("sklearn")
    skl2onnx = _need("skl2onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator.fit(x, y)
        onx = skl2onnx.to_onnx(estimator, x[:1], target_opset=ML_OPSET, options=options or None)
    return onx.SerializeToString(), {onx.graph.input[0].name: x}


# --------------------------------------------------------------------------- the cases
# Each returns (onnx bytes, feeds).  Names say estimator and variant.


def linear_models():
    from sklearn import linear_model as lm
    from sklearn.svm import SVR, LinearSVC, LinearSVR

    x, yc, yr = _data()
    yb = (yc > 0).astype(int)
    return {
        "LogisticRegression-binary": lambda: _skl(lm.LogisticRegression(), x, yb),
        "LogisticRegression-multi-nozipmap": lambda: _skl(lm.LogisticRegression(max_iter=500), x, yc,
                                                           zipmap=False),
        "LinearRegression": lambda: _skl(lm.LinearRegression(), x, yr),
        "Ridge": lambda: _skl(lm.Ridge(alpha=0.5), x, yr),
        "SGDClassifier-hinge": lambda: _skl(lm.SGDClassifier(random_state=0), x, yc),
        "SGDRegressor": lambda: _skl(lm.SGDRegressor(random_state=0), x, yr),
        "LinearSVC": lambda: _skl(LinearSVC(), x, yc),
        "LinearSVR": lambda: _skl(LinearSVR(random_state=0), x, yr),
        "SVR-rbf": lambda: _skl(SVR(kernel="rbf", C=2.0), x, yr),
    }


def svms():
    from sklearn.svm import SVC

    x, yc, _ = _data()
    yb = (yc > 0).astype(int)
    return {
        "SVC-rbf-multi": lambda: _skl(SVC(kernel="rbf"), x, yc),
        "SVC-poly-binary": lambda: _skl(SVC(kernel="poly", degree=3), x, yb),
        "SVC-linear-multi": lambda: _skl(SVC(kernel="linear"), x, yc),
        "SVC-rbf-proba-multi": lambda: _skl(SVC(kernel="rbf", probability=True, random_state=0), x, yc),
        "SVC-rbf-proba-binary-nozipmap": lambda: _skl(SVC(probability=True, random_state=0), x, yb, zipmap=False),
    }


def neighbours_and_bayes():
    from sklearn import naive_bayes as nb
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    x, yc, yr = _data()
    xpos = np.abs(x).round(1).astype(np.float32)
    return {
        "KNeighborsClassifier": lambda: _skl(KNeighborsClassifier(n_neighbors=5), x, yc),
        "KNeighborsRegressor": lambda: _skl(KNeighborsRegressor(n_neighbors=4), x, yr),
        "GaussianNB": lambda: _skl(nb.GaussianNB(), x, yc),
        "MultinomialNB": lambda: _skl(nb.MultinomialNB(), xpos, yc),
        "BernoulliNB": lambda: _skl(nb.BernoulliNB(), x, yc),
        "MLPClassifier": lambda: _skl(MLPClassifier(hidden_layer_sizes=(16,), max_iter=300, random_state=0), x, yc),
        "MLPRegressor": lambda: _skl(MLPRegressor(hidden_layer_sizes=(8,), max_iter=300, random_state=0), x, yr),
    }


def _hist(cls, x, y):
    """A HistGradientBoosting model.  skl2onnx 1.20 hands numpy bools (scikit-learn 1.9's
    missing_go_to_left) to onnx.helper, which refuses them as ints: they are made ints on the way."""
    from onnx import helper

    make_attribute = helper.make_attribute

    def ints_not_bools(key, value, *args, **kwargs):
        if isinstance(value, (list, tuple, np.ndarray)) and any(isinstance(v, (bool, np.bool_)) for v in value):
            value = [int(v) for v in value]
        return make_attribute(key, value, *args, **kwargs)

    helper.make_attribute = ints_not_bools
    try:
        return _skl(cls(max_iter=20, random_state=0), x, y)
    finally:
        helper.make_attribute = make_attribute


def tree_models():
    from sklearn import ensemble as en
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    x, yc, yr = _data()
    yb = (yc > 0).astype(int)
    return {
        "DecisionTreeClassifier": lambda: _skl(DecisionTreeClassifier(max_depth=5, random_state=0), x, yc),
        "DecisionTreeRegressor": lambda: _skl(DecisionTreeRegressor(max_depth=6, random_state=0), x, yr),
        "RandomForestClassifier-binary-nozipmap": lambda: _skl(
            en.RandomForestClassifier(n_estimators=20, max_depth=6, random_state=0), x, yb, zipmap=False),
        "RandomForestClassifier-multi": lambda: _skl(
            en.RandomForestClassifier(n_estimators=20, max_depth=6, random_state=0), x, yc),
        "RandomForestRegressor": lambda: _skl(en.RandomForestRegressor(n_estimators=20, max_depth=6, random_state=0),
                                              x, yr),
        "ExtraTreesClassifier": lambda: _skl(en.ExtraTreesClassifier(n_estimators=15, max_depth=6, random_state=0),
                                             x, yc),
        "ExtraTreesRegressor": lambda: _skl(en.ExtraTreesRegressor(n_estimators=15, max_depth=6, random_state=0),
                                            x, yr),
        "GradientBoostingClassifier-binary": lambda: _skl(
            en.GradientBoostingClassifier(n_estimators=30, random_state=0), x, yb),
        "GradientBoostingClassifier-multi-nozipmap": lambda: _skl(
            en.GradientBoostingClassifier(n_estimators=20, random_state=0), x, yc, zipmap=False),
        "GradientBoostingRegressor": lambda: _skl(en.GradientBoostingRegressor(n_estimators=40, random_state=0), x, yr),
        "HistGradientBoostingClassifier": lambda: _hist(en.HistGradientBoostingClassifier, x, yc),
        "HistGradientBoostingRegressor": lambda: _hist(en.HistGradientBoostingRegressor, x, yr),
    }


def pipelines():
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler, Normalizer, OneHotEncoder, StandardScaler
    from sklearn.svm import SVC

    x, yc, yr = _data()
    holes = x.copy()
    holes[::7, 1] = np.nan
    holes[::5, 4] = np.nan

    def column_transformer():
        _need("sklearn")
        skl2onnx = _need("skl2onnx")
        from skl2onnx.common.data_types import FloatTensorType, StringTensorType

        rng = np.random.default_rng(1)
        colours = np.array(["red", "green", "blue", "cyan"], dtype=object)[rng.integers(0, 4, len(x))]
        sizes = np.array(["S", "M", "L"], dtype=object)[rng.integers(0, 3, len(x))]
        y = (yc + (colours == "red")).clip(0, 2)
        # one column per input, as converted ColumnTransformers usually take them: integer column i of
        # the fitted table is input i of the ONNX model
        table = np.concatenate([x.astype(object), colours[:, None], sizes[:, None]], axis=1)
        pre = ColumnTransformer([("num", StandardScaler(), list(range(6))),
                                 ("cat", OneHotEncoder(handle_unknown="ignore"), [6, 7])])
        model = make_pipeline(pre, LogisticRegression(max_iter=500))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(table, y)
            inputs = [(f"f{i}", FloatTensorType([None, 1])) for i in range(6)] + \
                     [("colour", StringTensorType([None, 1])), ("size", StringTensorType([None, 1]))]
            onx = skl2onnx.convert_sklearn(model, initial_types=inputs, target_opset=ML_OPSET)
        feeds = {f"f{i}": np.ascontiguousarray(x[:, i:i + 1]) for i in range(6)}
        feeds["colour"] = colours.reshape(-1, 1).copy()
        feeds["size"] = sizes.reshape(-1, 1)
        feeds["colour"][3, 0] = "magenta"  # a category the encoder never saw: ignored, as trained
        return onx.SerializeToString(), feeds

    def one_hot():
        _need("sklearn")
        skl2onnx = _need("skl2onnx")
        from skl2onnx.common.data_types import Int64TensorType

        cats = np.random.default_rng(2).integers(0, 5, size=(100, 2)).astype(np.int64)
        enc = OneHotEncoder(handle_unknown="ignore").fit(cats)
        onx = skl2onnx.convert_sklearn(enc, initial_types=[("X", Int64TensorType([None, 2]))],
                                       target_opset=ML_OPSET)
        probe = cats.copy()
        probe[0, 0] = 9  # unknown: a zero row
        return onx.SerializeToString(), {"X": probe}

    def dict_vectorizer():
        _need("sklearn")
        skl2onnx = _need("skl2onnx")
        from skl2onnx.common.data_types import DictionaryType, FloatTensorType, StringTensorType
        from sklearn.feature_extraction import DictVectorizer

        rows = [{"temp": float(a), "humidity": float(b)} | ({"wind": 1.0} if i % 3 else {})
                for i, (a, b) in enumerate(x[:60, :2])]
        dv = DictVectorizer(sparse=False).fit(rows)
        onx = skl2onnx.convert_sklearn(dv, initial_types=[("X", DictionaryType(StringTensorType([]), FloatTensorType([])))],
                                       target_opset=ML_OPSET)
        return onx.SerializeToString(), {"X": {"temp": 21.5, "wind": 3.0, "unknown": 1.0}}

    return {
        "Pipeline-StandardScaler-LogisticRegression": lambda: _skl(
            make_pipeline(StandardScaler(), LogisticRegression()), x, yc),
        "Pipeline-MinMaxScaler-SVC": lambda: _skl(make_pipeline(MinMaxScaler(), SVC()), x, yc),
        "Pipeline-Normalizer-KNeighbors": lambda: _skl(make_pipeline(Normalizer(), KNeighborsClassifier(3)), x, yc),
        "Pipeline-SimpleImputer-LinearRegression": lambda: _skl(
            make_pipeline(SimpleImputer(strategy="mean"), LinearRegression()), holes, yr),
        "OneHotEncoder-int": one_hot,
        "ColumnTransformer-numeric-and-string": column_transformer,
        "DictVectorizer-map-input": dict_vectorizer,
    }


def boosters():
    x, yc, yr = _data(n=300)
    yb = (yc > 0).astype(int)

    def lightgbm(kind, y, n_estimators=30):
        lgb = _need("lightgbm")
        _need("onnxmltools")
        from onnxmltools import convert_lightgbm
        from onnxmltools.convert.common.data_types import FloatTensorType

        model = (lgb.LGBMClassifier if kind == "clf" else lgb.LGBMRegressor)(
            n_estimators=n_estimators, num_leaves=15, min_child_samples=5, verbose=-1, random_state=0)
        model.fit(x, y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onx = convert_lightgbm(model, initial_types=[("X", FloatTensorType([None, x.shape[1]]))],
                                   target_opset=15, zipmap=False)
        return onx.SerializeToString(), {"X": x}

    def xgboost(kind, y, n_estimators=30):
        xgb = _need("xgboost")
        _need("onnxmltools")
        from onnxmltools import convert_xgboost
        from onnxmltools.convert.common.data_types import FloatTensorType

        model = (xgb.XGBClassifier if kind == "clf" else xgb.XGBRegressor)(
            n_estimators=n_estimators, max_depth=4, random_state=0, base_score=0.5 if kind == "clf" else None)
        model.fit(x, y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onx = convert_xgboost(model, initial_types=[("X", FloatTensorType([None, x.shape[1]]))],
                                  target_opset=15)
        return onx.SerializeToString(), {"X": x}

    return {
        "LGBMClassifier-binary": lambda: lightgbm("clf", yb),
        "LGBMClassifier-multi": lambda: lightgbm("clf", yc),
        "LGBMRegressor": lambda: lightgbm("reg", yr),
        "XGBClassifier-binary": lambda: xgboost("clf", yb),
        "XGBClassifier-multi": lambda: xgboost("clf", yc),
        "XGBRegressor": lambda: xgboost("reg", yr),
    }


def all_cases() -> dict:
    cases = {}
    for group in (linear_models, svms, neighbours_and_bayes, tree_models, pipelines, boosters):
        try:
            cases.update(group())
        except ImportError as exc:  # scikit-learn itself missing: one skipped entry per group
            cases[group.__name__] = lambda exc=exc: pytest.skip(f"{exc.name} is not installed")
    return cases


CASES = all_cases()


def check_case(name: str) -> dict:
    model, feeds = CASES[name]()
    expected = run_onnxruntime(model, feeds)
    actual, size = run_minirt(model, feeds)
    row = compare_outputs(expected, actual)
    # batch 1 as well: onnxruntime and minirt take other paths for one sample
    one = {k: (v[:1] if isinstance(v, np.ndarray) else v) for k, v in feeds.items()}
    compare_outputs(run_onnxruntime(model, one), run_minirt(model, one)[0], scale_of=expected)
    return {**row, "onnx_bytes": len(model), "mrt_bytes": size}


@pytest.mark.parametrize("name", sorted(CASES))
def test_converted_model_matches_onnxruntime(name):
    check_case(name)


if __name__ == "__main__":  # the table for the closing note
    print("| model | status | max abs diff | max rel diff | onnx bytes | mrt bytes |")
    print("|---|---|---|---|---|---|")
    for name in sorted(CASES):
        try:
            r = check_case(name)
            print(f"| {name} | ok | {r['max_abs']:.2e} | {r['max_rel']:.2e} | {r['onnx_bytes']} | {r['mrt_bytes']} |")
        except BaseException as exc:  # noqa: BLE001 - a table row per failure
            print(f"| {name} | FAIL: {type(exc).__name__}: {str(exc).splitlines()[0][:120]} | | | | |")
