"""SQL for the views: one per paper table/figure (ours beside the paper's) and one per recipe.

Paper-table views put our aggregate and the paper's number side by side, `ours_<col>` and `paper_<col>`, with a
FULL OUTER JOIN so a paper row with no run yet has n_runs = 0 and a run with no paper row still shows up. Which
summary key feeds which column is registry/keys.py's TABLE_COLUMNS; the view SQL is generated from it.
"""
from __future__ import annotations

import re

from . import keys as K

DONE = "t.status = 'completed'"

# Which trials feed which LM table: Table 3 = matched by head dim (the default when a trial names no matching),
# Table 4 = matched by heads, Table 5 = recipes named table5* (2048-token context).
LM_FILTERS = {
    "table3": "coalesce(t.matching, 'head_dim') = 'head_dim' AND coalesce(t.recipe, '') NOT LIKE 'table5%'",
    "table4": "t.matching = 'heads' AND coalesce(t.recipe, '') NOT LIKE 'table5%'",
    "table5": "coalesce(t.recipe, '') LIKE 'table5%'",
}


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def lm_table(name: str, where: str = "TRUE") -> str:
    cols = K.TABLE_COLUMNS[name]
    agg = ",\n    ".join(f"avg(s.value) FILTER (WHERE s.key = {lit(c.key)}) * {c.scale} AS {c.paper}" for c in cols)
    keys = ", ".join(lit(c.key) for c in cols)
    side = ",\n  ".join(f"o.{c.paper} AS ours_{c.paper}, p.{c.paper} AS paper_{c.paper}" for c in cols)
    return f"""
WITH ours AS (
  SELECT t.size_label AS size, t.model_label AS model, count(DISTINCT t.trial_id) AS n_runs,
    {agg}
  FROM trials t JOIN summary s USING (trial_id)
  WHERE {DONE} AND ({where}) AND s.key IN ({keys}) AND ({LM_FILTERS[name]})
  GROUP BY ALL)
SELECT coalesce(p.size, o.size) AS size, coalesce(p.model, o.model) AS model, coalesce(o.n_runs, 0) AS n_runs,
  {side},
  p.source, p.note
FROM paper_{name} p FULL OUTER JOIN ours o ON p.size = o.size AND p.model = o.model
ORDER BY size, model"""


def table2(where: str = "TRUE") -> str:
    cols = K.TABLE_COLUMNS["table2"]
    pivot = ",\n    ".join(f"max(best) FILTER (WHERE language = {lit(c.language)}) AS {c.paper}" for c in cols)
    side = ",\n  ".join(f"o.{c.paper} AS ours_{c.paper}, p.{c.paper} AS paper_{c.paper}" for c in cols)
    parts = " + ".join(f"o.{c.paper}" for c in cols)
    nonnull = " AND ".join(f"o.{c.paper} IS NOT NULL" for c in cols)
    return f"""
WITH best AS (  -- the paper reports the best of 3 seeds: max over our seeds too
  SELECT t.model_label AS model, t.beta_range, t.language, max(s.value) AS best, count(DISTINCT t.trial_id) AS n,
    count(DISTINCT t.seed) AS n_seeds
  FROM trials t JOIN summary s USING (trial_id)
  WHERE {DONE} AND ({where}) AND s.key = {lit(K.SCALED_ACC)} AND t.language IS NOT NULL
  GROUP BY ALL),
ours AS (
  SELECT model, beta_range, sum(n)::BIGINT AS n_runs, min(n_seeds)::BIGINT AS min_seeds,
    max(n_seeds)::BIGINT AS max_seeds,
    {pivot}
  FROM best GROUP BY ALL)
SELECT coalesce(p.model, o.model) AS model, coalesce(p.beta_range, o.beta_range) AS beta_range,
  coalesce(o.n_runs, 0) AS n_runs, o.min_seeds, o.max_seeds,
  {side},
  CASE WHEN {nonnull} THEN ({parts}) / {len(cols)} END AS ours_avg, p.avg AS paper_avg,
  p.source, p.note
FROM paper_table2 p FULL OUTER JOIN ours o ON p.model = o.model AND p.beta_range = o.beta_range
ORDER BY beta_range DESC, model"""


def fig5_runs(where: str = "TRUE") -> str:
    return f"""
SELECT t.trial_id, t.group_name, t.model_label AS model, t.n_h, coalesce(t.num_layers, 1) AS num_layers,
  t.beta_range, t.train_len, t.seed,
  max(s.value) FILTER (WHERE s.key = {lit(K.MAX_LEN_ACC90)}) AS max_len_acc90,
  max(s.value) FILTER (WHERE s.key = {lit(K.ACC_AT_TRAIN_LEN)}) AS acc_at_train_len,
  max(s.value) FILTER (WHERE s.key = {lit(K.TOKEN_ACC)}) AS token_acc
FROM trials t LEFT JOIN summary s USING (trial_id)
WHERE {DONE} AND ({where}) AND t.group_name IS NOT NULL
GROUP BY ALL
ORDER BY t.group_name, num_layers, t.n_h"""


def fig5_fits(where: str = "TRUE") -> str:
    # fig5_runs and whether each "fits the training range": prefix accuracy >= 0.9 at the training length (from
    # acc_at_train_len, else from max_len_acc90 >= train_len); Figs. 5 and 12 both read it
    return f"""
SELECT *, coalesce(acc_at_train_len >= 0.9, max_len_acc90 >= coalesce(train_len, 128)) AS fits
FROM ({fig5_runs(where)})"""


def fig5(where: str = "TRUE") -> str:
    # The paper's rows: min n_h for one layer, min layers for n_h = 1 (beta [-1,1]), of the runs that fit.
    return f"""
WITH r AS (
  SELECT * FROM ({fig5_fits(where)}) WHERE coalesce(beta_range, '[-1,1]') = '[-1,1]'),
ours AS (
  SELECT group_name, count(*) AS n_runs,
    min(n_h) FILTER (WHERE num_layers = 1 AND fits) AS min_n_h_one_layer,
    list_sort(list(DISTINCT n_h) FILTER (WHERE num_layers = 1)) AS n_h_tried,
    min(num_layers) FILTER (WHERE n_h = 1 AND fits) AS min_layers_n_h1,
    list_sort(list(DISTINCT num_layers) FILTER (WHERE n_h = 1)) AS layers_tried,
    max(max_len_acc90) AS best_max_len_acc90
  FROM r GROUP BY ALL),
per_seed AS (  -- one layer: at each n_h, how many of the seeds fit (a claim must not rest on one seed)
  SELECT group_name, n_h, count(DISTINCT seed) FILTER (WHERE fits) AS n_fit, count(DISTINCT seed) AS n_seeds
  FROM r WHERE num_layers = 1 GROUP BY ALL),
seeds AS (
  SELECT group_name, list(struct_pack(n_h := n_h, n_fit := n_fit, n_seeds := n_seeds) ORDER BY n_h) AS fits_per_seed
  FROM per_seed GROUP BY ALL)
SELECT coalesce(p."group", o.group_name) AS group_name, coalesce(o.n_runs, 0) AS n_runs,
  o.min_n_h_one_layer AS ours_min_n_h_one_layer, p.min_n_h_one_layer AS paper_min_n_h_one_layer, o.n_h_tried,
  o.min_layers_n_h1 AS ours_min_layers_n_h1, p.min_layers_n_h1 AS paper_min_layers_n_h1, o.layers_tried,
  o.best_max_len_acc90, sd.fits_per_seed, p.train_len AS paper_train_len, p.test_len AS paper_test_len, p.source,
  p.note
FROM paper_fig5 p FULL OUTER JOIN ours o ON p."group" = o.group_name
LEFT JOIN seeds sd ON sd.group_name = o.group_name
ORDER BY group_name"""


def fig12(where: str = "TRUE") -> str:
    # Fig. 12 (App. C.1): the Fig. 5 grid with beta in [0,1] (eigenvalues in [0,1]), the negative control. Per group:
    # the one-layer n_h and the n_h = 1 depths that fit the training range with beta [0,1], beside the one-layer n_h
    # that fit with beta [-1,1] in the same workspace (the fig5 recipe's runs), so the control reads against its
    # positive. Groups with no beta [0,1] run are left out.
    return f"""
WITH r AS ({fig5_fits(where)})
SELECT group_name,
  count(*) FILTER (WHERE beta_range = '[0,1]') AS n_runs,
  list_sort(list(DISTINCT n_h) FILTER (WHERE beta_range = '[0,1]' AND num_layers = 1 AND fits)) AS fit_n_h_01,
  list_sort(list(DISTINCT n_h) FILTER (WHERE beta_range = '[0,1]' AND num_layers = 1)) AS n_h_tried_01,
  list_sort(list(DISTINCT num_layers) FILTER (WHERE beta_range = '[0,1]' AND n_h = 1 AND fits)) AS fit_layers_01,
  list_sort(list(DISTINCT num_layers) FILTER (WHERE beta_range = '[0,1]' AND n_h = 1)) AS layers_tried_01,
  max(max_len_acc90) FILTER (WHERE beta_range = '[0,1]') AS best_max_len_acc90_01,
  count(*) FILTER (WHERE coalesce(beta_range, '[-1,1]') = '[-1,1]') AS n_runs_11,
  list_sort(list(DISTINCT n_h) FILTER (WHERE coalesce(beta_range, '[-1,1]') = '[-1,1]' AND num_layers = 1 AND fits))
    AS fit_n_h_11,
  max(max_len_acc90) FILTER (WHERE coalesce(beta_range, '[-1,1]') = '[-1,1]') AS best_max_len_acc90_11
FROM r GROUP BY group_name
HAVING count(*) FILTER (WHERE beta_range = '[0,1]') > 0
ORDER BY group_name"""


def baselines(where: str = "TRUE") -> str:
    # One row per (architecture, group) of the state-tracking trials that name their family (the baselines recipe;
    # fig5's DeltaProduct trials too): the best length at accuracy >= 0.9 over the runs and seeds.
    return f"""
SELECT t.model__family AS family, t.group_name, count(DISTINCT t.trial_id) AS n_runs,
  list_sort(list(DISTINCT t.n_h)) AS n_h, list_sort(list(DISTINCT coalesce(t.num_layers, 1))) AS layers,
  list_sort(list(DISTINCT t.train_len)) AS train_len,
  max(s.value) FILTER (WHERE s.key = {lit(K.MAX_LEN_ACC90)}) AS best_max_len_acc90,
  max(s.value) FILTER (WHERE s.key = {lit(K.ACC_AT_TRAIN_LEN)}) AS best_acc_at_train_len,
  avg(s.value) FILTER (WHERE s.key = {lit(K.TOKENS_PER_S)}) AS tokens_per_s
FROM trials t LEFT JOIN summary s USING (trial_id)
WHERE {DONE} AND ({where}) AND t.group_name IS NOT NULL AND t.model__family IS NOT NULL
GROUP BY ALL
ORDER BY family, t.group_name"""


def fig4(where: str = "TRUE") -> str:
    # One row per (task, matching, shape, model, impl). The ratio to n_h = 1 compares like with like (same impl);
    # dpx_over_fla sets our mixer against fla's layer in the same LM at the same shape and model.
    return f"""
WITH r AS (
  SELECT t.task_name, t.model_label AS model, t.n_h, t.gated, t.matching, t.seq_len, t.batch_size,
    t.seq_len * t.batch_size AS tokens_per_batch, coalesce(t.impl, 'dpx') AS impl,
    avg(s.value) AS tokens_per_s, count(DISTINCT t.trial_id) AS n_runs
  FROM trials t JOIN summary s USING (trial_id)
  WHERE {DONE} AND ({where}) AND s.key = {lit(K.TOKENS_PER_S)}
  GROUP BY ALL)
SELECT a.*, a.tokens_per_s / b.tokens_per_s AS ratio_to_n_h1,
  CASE WHEN a.impl = 'dpx' THEN a.tokens_per_s / f.tokens_per_s END AS dpx_over_fla
FROM r a
LEFT JOIN r b ON b.n_h = 1 AND b.impl = a.impl AND b.task_name IS NOT DISTINCT FROM a.task_name
  AND b.gated IS NOT DISTINCT FROM a.gated
  AND b.matching IS NOT DISTINCT FROM a.matching AND b.seq_len IS NOT DISTINCT FROM a.seq_len
  AND b.batch_size IS NOT DISTINCT FROM a.batch_size
LEFT JOIN r f ON f.impl = 'fla' AND f.n_h IS NOT DISTINCT FROM a.n_h AND f.task_name IS NOT DISTINCT FROM a.task_name
  AND f.gated IS NOT DISTINCT FROM a.gated
  AND f.matching IS NOT DISTINCT FROM a.matching AND f.seq_len IS NOT DISTINCT FROM a.seq_len
  AND f.batch_size IS NOT DISTINCT FROM a.batch_size
ORDER BY a.task_name, a.matching, a.seq_len, a.batch_size, a.gated, a.n_h, a.impl"""


def fig8(where: str = "TRUE") -> str:
    # Training context: the trial's own (train_len), else the paper's 4096.
    return f"""
WITH c AS (
  SELECT t.trial_id, t.model_label AS model, t.n_h, t.gated, t.num_heads,
    coalesce(nullif(regexp_extract(c.key, '^{K.CURVE_LOSS_AT_POS}/(.+)$', 1), ''), t.dataset) AS dataset,
    coalesce(t.train_len, 4096) AS train_ctx, c.x, c.y
  FROM trials t JOIN curves c USING (trial_id)
  WHERE {DONE} AND ({where}) AND (c.key = '{K.CURVE_LOSS_AT_POS}' OR c.key LIKE '{K.CURVE_LOSS_AT_POS}/%'))
SELECT trial_id, model, n_h, gated, num_heads, dataset, train_ctx,
  avg(y) FILTER (WHERE x <= train_ctx) AS loss_in_ctx, avg(y) FILTER (WHERE x > train_ctx) AS loss_beyond_ctx,
  avg(y) FILTER (WHERE x > train_ctx) / avg(y) FILTER (WHERE x <= train_ctx) AS beyond_over_in,
  max(x) AS max_pos, count(*) AS n_points
FROM c GROUP BY ALL ORDER BY dataset, n_h, model"""


def fig9(where: str = "TRUE") -> str:
    return f"""
WITH c AS (
  SELECT t.trial_id, t.model_label AS model, t.n_h, t.gated,
    TRY_CAST(regexp_extract(c.key, '^{K.CURVE_ERANK}/l(\\d+)/h(\\d+)$', 1) AS INTEGER) AS layer,
    TRY_CAST(regexp_extract(c.key, '^{K.CURVE_ERANK}/l(\\d+)/h(\\d+)$', 2) AS INTEGER) AS head,
    coalesce(t.train_len, 4096) AS train_ctx, c.x, c.y
  FROM trials t JOIN curves c USING (trial_id)
  WHERE {DONE} AND ({where}) AND c.key LIKE '{K.CURVE_ERANK}/%')
SELECT trial_id, model, n_h, gated, layer, head, train_ctx,
  avg(y) FILTER (WHERE x <= train_ctx) AS erank_in_ctx, avg(y) FILTER (WHERE x > train_ctx) AS erank_beyond_ctx,
  avg(y) FILTER (WHERE x > train_ctx) / avg(y) FILTER (WHERE x <= train_ctx) AS beyond_over_in,
  max(y) AS erank_max, max(x) AS max_pos
FROM c WHERE layer IS NOT NULL GROUP BY ALL ORDER BY model, layer, head"""


def view_name_for_recipe(recipe: str, taken: set[str] | None = None) -> str:
    """recipe_<name> with non-word characters as '_'; a suffix when two recipes map to the same name."""
    base = "recipe_" + re.sub(r"\W", "_", recipe).lower()
    name, i = base, 2
    while taken is not None and name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def recipe_view(recipe: str, config_cols: list[str], summary_keys: list[str]) -> str:
    """One row per trial of the recipe: identity, status, timings, the config columns that vary or exist there,
    and one column per summary key."""
    fixed = ("trial_id, status, attempts, model_label, n_h, beta_range, num_layers, size_label, task_name, "
             "group_name, language, dataset, seed, duration_s, host, device, error")
    cfg = "".join(f", t.{ident(c)}" for c in config_cols)
    used = {c.strip().lower() for c in fixed.split(",")} | {c.lower() for c in config_cols}
    # a summary key that names a column already there (DuckDB names are case-insensitive) gets a summary__ prefix;
    # two keys that differ only in case (`Foo`, `foo`) get `_2`, ... so that no name is there twice
    names = []
    for k in summary_keys:
        name = ("summary__" + k) if k.lower() in used else k
        base, i = name, 2
        while name.lower() in used:
            name, i = f"{base}_{i}", i + 1
        used.add(name.lower())
        names.append(name)
    piv = "".join(f",\n  max(s.value) FILTER (WHERE s.key = {lit(k)}) AS {ident(n)}"
                  for k, n in zip(summary_keys, names))
    fixed_t = ", ".join(f"t.{c.strip()}" for c in fixed.split(","))
    return f"""
SELECT {fixed_t}{cfg}{piv}
FROM trials t LEFT JOIN summary s USING (trial_id)
WHERE t.trial_id IN (SELECT trial_id FROM trial_recipes WHERE recipe = {lit(recipe)})
GROUP BY ALL ORDER BY t.trial_id"""


# name -> SQL generator taking an extra condition on `t` (trials); the stored views use "TRUE" (all recipes),
# compare/report pass recipe_filter(name) to restrict to one recipe.
PAPER_VIEWS = {
    "table2": table2, "table3": lambda where="TRUE": lm_table("table3", where),
    "table4": lambda where="TRUE": lm_table("table4", where), "table5": lambda where="TRUE": lm_table("table5", where),
    "fig5_runs": fig5_runs, "fig5": fig5, "fig12": fig12, "fig4": fig4, "fig8": fig8, "fig9": fig9,
}


def recipe_filter(recipe: str | None) -> str:
    # membership, not trials.recipe: a trial shared by several recipes (same config, same id) is in each
    return "TRUE" if recipe is None else f"t.trial_id IN (SELECT trial_id FROM trial_recipes WHERE recipe = {lit(recipe)})"
