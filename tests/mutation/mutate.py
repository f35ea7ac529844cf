"""Mutation check of the integer model: does a wrong formula get caught?

Applies each small formula mutation below, one at a time, to a copy of milp_plan/ and runs
a probe on it: every config's model of a small instance solved on its own against that
config's exhaustive optimum (each schedule, slow links, per-GPU billing), the simulated step's
bound weights and seed paths against the simulator (tests/test_paths.py), CP-SAT solves of
small random instances (realistic transfers, per-GPU and per-node billing, binding memory,
every objective, both modes) compared with brute force (which reads only predict.evaluate
and the checker), and the default instance. A
mutation is caught when the probe fails: an InternalError (the model's objective drifts
from the cost model's beyond its rounding), a checker rejection, a plan over a limit, or an
objective that differs from brute force's beyond the reported gap.

    python tests/mutation/mutate.py            # every mutation; prints caught / total
    python tests/mutation/mutate.py --list     # the mutations
    python tests/mutation/mutate.py --only 3   # one of them

Not part of the test run (several minutes).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPE = "milp_plan/formulations/pipeline.py"
SLICE = "milp_plan/slice_bounds.py"
COEF = "milp_plan/formulations/coefficients.py"
SCHED = "milp_plan/schedules.py"
PARENT = "milp_plan/solvers/parent_bounds.py"
FREE_START = "milp_plan/heuristics/free_start.py"
CLOSED = "closed-form"   # probed with every plan predicted by the closed form (the large plans' basis)

# (file, description, original text, mutated text[, basis]): each a plausible slip in a formula.
# Probes run with the simulated step (small plans' basis) unless the mutation names CLOSED.
MUTATIONS = [
    (PIPE, "a path's forward work dropped",
     "for part, share in ((2, path.fwd[s]), (1, path.bwd[s])):", "for part, share in ((1, path.bwd[s]),):"),
    (PIPE, "a path's reduction dropped", "            if path.dp[s]:", "            if False:"),
    (PIPE, "a path's optimizer step dropped", "            terms.append(sc * v.opt)", "            pass"),
    (PIPE, "a path's hops counted once", "                k = round(sc * count)\n                terms.append",
     "                k = sc\n                terms.append"),
    (PIPE, "a path's wrap transfer dropped", "        if path.wrap:", "        if False:"),
    (PIPE, "a path's forward and backward swapped",
     "for part, share in ((2, path.fwd[s]), (1, path.bwd[s])):", "for part, share in ((1, path.fwd[s]), (2, path.bwd[s])):"),
    (SCHED, "1F1B bound takes the closed form's weights (not valid for the simulation)",
     "return [(float(m), 0.0, False, 0.0), (m - 1.0 - (w0 - 1) * phi.hi, 1.0, True, -(w0 - 1) * phi.excess)]",
     "return [(m - 1.0, 1.0, True, 0.0)]"),
    (SCHED, "interleaved bound drops the warm-up correction",
     "(m - 1.0 / v - w0 * phi.hi / v, 1.0 / v + (1 - 1.0 / v) * phi.lo, True, -w0 * phi.excess / v)",
     "(m - 1.0 / v, 1.0 / v + (1 - 1.0 / v) * phi.lo, True, 0.0)"),
    (SCHED, "the interleaved chain path's bound counts every hop (the bug test_paths found)",
     "return [(float(m), 0.0, False, 0.0),\n                (m - 1.0 / v",
     "return [(float(m), 0.0, True, 0.0),\n                (m - 1.0 / v"),
    (PIPE, "driver never sees a plan the model underestimates",
     "        return raw_step < p.step_time_s * self.v.scale * self.res.tps - err - 1", "        return False"),

    (PIPE, "1F1B window counts each hop once (2 h -> 1 h)",
     "ts[s] + 2 * self._scaled_hop(s, w)", "ts[s] + 1 * self._scaled_hop(s, w)", CLOSED),
    ("milp_plan/cluster.py", "per-GPU billing charged per node",
     'return self.usd_per_hour * nodes if self.billing == "node" else self.usd_per_gpu_hour * gpus',
     'return self.usd_per_hour * nodes'),
    (PIPE, "a shared-node pool kept in one run (A100 x2, A10 x2, A100 x2 lost)",
     "                be.add(v.st[s, p] <= 1 - before)\n",
     "                be.add(v.st[s, p] <= 1 - before)\n                be.add(be.sum([v.st[a, p] for a in range(s + 1)]) <= 1)\n"),
    (PIPE, "a run's stage positions do not advance (node boundaries never come)",
     "                        be.add(v.w[s, p, i] >= v.w[s - 1, p, (i - 1) % q] + on - 1)",
     "                        be.add(v.w[s, p, i] >= v.w[s - 1, p, i % q] + on - 1)"),
    (PIPE, "a node boundary after a node's first stage, not its last",
     "                    v.g[s, p] = self._and(f\"g[{s},{p}]\", v.e[s, p], v.w[s, p, q - 1])",
     "                    v.g[s, p] = self._and(f\"g[{s},{p}]\", v.e[s, p], v.w[s, p, 0])"),
    (PIPE, "the interleaved wrap intra-node whenever both ends share a pool (two runs are two nodes)",
     "                    terms.append((self._all_on(p), c.hop_intra(p), c.hop_inter(p, c.pools[p].k)))",
     "                    terms.append((w, c.hop_intra(p), c.hop_inter(p, c.pools[p].k)))"),
    (PIPE, "a node-billed shared-node pool priced by its stage count (a second run's node free)",
     "        return pool.place.stages_per_node >= 2 and self.c.types[pool.k].billing == \"node\"",
     "        return False"),
    (PIPE, "1F1B windows dropped (z = max t_s only)",
     "be.add(k * v.pipe >= Q[c] - (Q[a] if a else 0) + ts[c] - (k - 1))", "pass", CLOSED),
    (PIPE, "interleaved steady weight m vpp - 1 -> m vpp - 2",
     "w = m * cfg.vpp - 1", "w = m * cfg.vpp - 2", CLOSED),
    (PIPE, "interleaved fill/drain hops vpp^2 -> vpp",
     "2 * vp * vp * hops", "2 * vp * hops", CLOSED),
    (PIPE, "interleaved wrap transfer dropped",
     "2 * vp * (vp - 1) * v.wrap", "0 * v.wrap", CLOSED),
    (PIPE, "dp tail hides twice the hops",
     "be.add(x == be.sum([out[-1], v.bwd_up[k], sc * v.h_up[k]]))",
     "be.add(x == be.sum([out[-1], v.bwd_up[k], 2 * sc * v.h_up[k]]))", CLOSED),
    (PIPE, "interleaved optimizer step not scaled by vpp",
     "v.D, vp * v.opt])", "v.D, v.opt])", CLOSED),
    (PIPE, "memory capacity 10% larger",
     "be.add(be.sum(terms) <= down(self.c.capacity(o)))", "be.add(be.sum(terms) <= down(1.1 * self.c.capacity(o)))"),
    (PIPE, "GPipe backward flow shop reads the whole stage time",
     "be.add(zb >= self._stage_expr(s, 1, w))", "be.add(zb >= self._stage_expr(s, 0, w))", CLOSED),
    (PIPE, "a hop inside a node priced as one between nodes",
     "terms += [(v.e[s, p], c.hop_intra(p), 0.0),", "terms += [(v.e[s, p], c.hop_inter(p, c.pools[p].k), 0.0),"),
    (PIPE, "full recompute may recompute no layer",
     "be.add(v.rr[s, o] >= vpp * v.y[s, o])", "be.add(v.rr[s, o] >= 0 * v.y[s, o])"),
    (PIPE, "step time drops the optimizer step (1F1B, GPipe)",
     "v.step = be.sum([v.pipe, be.sum(v.t), 2 * hops, v.D, v.opt])", "v.step = be.sum([v.pipe, be.sum(v.t), 2 * hops, v.D])", CLOSED),
    (PIPE, "1F1B steady weight m - 1 -> m",
     "        w = m - 1\n", "        w = m\n", CLOSED),
    (PIPE, "dp tail slack uses the full stage time",
     "self._stage_expr(s, 1, rnd=self.res.t_up)", "self._stage_expr(s, 0, rnd=self.res.t_up)", CLOSED),
    (PIPE, "tied embedding all-reduce left out of a path's end-stage reduction",
     "                    terms.append(k * v.emb)", "                    pass"),
    (PIPE, "tied embedding all-reduce priced one way only (the first stage's)",
     "        for end, other in ((0, last), (last, 0)):", "        for end, other in ((0, last),):"),
    (PIPE, "tied embedding all-reduce inside one node priced over the network",
     "                                           - (both if j == k else 0)))", "                                           - 0))"),
    (PIPE, "tied embedding all-reduce left out of the closed form's reduction tail",
     "                    dp = be.sum([dp, v.emb])", "                    pass", CLOSED),
    (PIPE, "$/h budget 10% looser in the model",
     "be.add(v.usd_h <= down(lim.budget_usd_per_hour * res.money))",
     "be.add(v.usd_h <= down(1.1 * lim.budget_usd_per_hour * res.money))"),
    (PIPE, "mixed-type bundles do not share their member types' nodes (add_shared_nodes off)",
     "        mixed = [q for q in self.P if isinstance(c.types[c.pools[q].k], MixedNodeType)]", "        mixed = []"),
    (COEF, "a mixed-type stage's reduction priced as one node",
     "            nodes, per_node = nt.real_nodes, nt.busiest_node", "            pass"),
    ("milp_plan/costmodel.py", "a mixed-type stage paced by its fastest replica",
     "        return LayerTimes(*(max(t) for t in zip", "        return LayerTimes(*(min(t) for t in zip"),
    ("milp_plan/costmodel.py", "a mixed-type stage's hop senders taken as its whole bundle",
     "    return nt.busiest_node if isinstance(nt, MixedNodeType) else min(group, nt.gpus_per_node)",
     "    return min(group, nt.gpus_per_node)"),
    ("milp_plan/costmodel.py", "a mixed-type stage's optimizer step at its fastest GPU",
     "        return max(optimizer_s(inst, params_updated, nt) for nt, _ in node_type.members)",
     "        return min(optimizer_s(inst, params_updated, nt) for nt, _ in node_type.members)"),
    (SCHED, "1F1B bound drops the forward share's excess",
     "(m - 1.0 - (w0 - 1) * phi.hi, 1.0, True, -(w0 - 1) * phi.excess)", "(m - 1.0 - (w0 - 1) * phi.hi, 1.0, True, 0.0)"),
    (COEF, "the forward share's hi read from the per-layer parts alone, with no excess for the ends",
     "        return ForwardShare(max(lo, 0.0), hi, excess)", "        return ForwardShare(max(lo, 0.0), hi, 0.0)"),
    ("milp_plan/solvers/bounds.py", "the tied all-reduce bound doubles E (both directions one after the other)",
     "                        best = min(best, max(v0, v1))",
     "                        best = min(best, 2 * max(v0, v1))"),
    ("milp_plan/solvers/bounds.py", "the tied all-reduce bound never lets both ends share a node",
     "same = q0 == q1 and coef.pools[q0].place.stages_per_node >= cfg.pp", "same = False"),
    ("milp_plan/solvers/bounds.py", "the least layer sum asks each node type for one stage more than the others leave",
     "need = max(1 if slot.required else 0, pp - (formed - stages) if coupled else 0)",
     "need = max(1 if slot.required else 0, pp - (formed - stages) + 1 if coupled else 0)"),
    ("milp_plan/solvers/bounds.py", "a full-recompute stage's pieces count its first recompute twice",
     "    e = np.where(n <= room, a + rho * (r_min - 1) / n, np.inf)",
     "    e = np.where(n <= room, a + rho * r_min / n, np.inf)"),
    ("milp_plan/solvers/bounds.py", "a full-recompute stage's pieces take the most recomputes any position needs",
     "        r_min = np.where(holds, np.minimum(r_min, need), r_min)",
     "        r_min = np.where(holds, np.maximum(np.where(np.isinf(r_min), 0.0, r_min), need), r_min)"),
    ("milp_plan/solvers/bounds.py", "budget_bound's $/h cap (3600 B / lb) halved",
     "        cap = SECONDS_PER_HOUR * budget * (1 + 1e-9) / lb", "        cap = 0.5 * SECONDS_PER_HOUR * budget * (1 + 1e-9) / lb"),
    ("milp_plan/solvers/bounds.py", "least_usd_per_hour takes the dearest GPUs first",
     "sorted(physical, key=lambda nt: (nt.usd_per_gpu_hour, nt.name))",
     "sorted(physical, key=lambda nt: (-nt.usd_per_gpu_hour, nt.name))"),
    (COEF, "a family's work bound takes the slowest per-layer time of any option",
     "        return min(self._time(opt, *ends)[0].a for opt in self.options for ends in self._all_ends())",
     "        return max(self._time(opt, *ends)[0].a for opt in self.options for ends in self._all_ends())"),
    ("milp_plan/solvers/bounds.py", "a family's work bound spreads the layers over one stage fewer",
     "        return work if cost else work / cfg.pp", "        return work if cost else work / max(1, cfg.pp - 1)"),
    (SLICE, "the sliced work bound's fill path keeps the heaviest stage's own first or last slices (no - rho Z)",
     "    return (m - u / least) * z + L * u + extra", "    return m * z + L * u + extra"),
    (SLICE, "the sliced work bound's end path counts the ends' slices whole (Q for (1 - 1 / n) Q)",
     "    return (m - 1) * z + S / n + (1 - 1 / n) * Q + hops", "    return (m - 1) * z + S / n + Q + hops"),
    (SLICE, "a placed count bounds the others at the largest ratio of per-layer sums (not the least)",
     "    return (R / R[:, j:j + 1]).min(axis=0)", "    return (R / R[:, j:j + 1]).max(axis=0)"),
    (SLICE, "a slicing row's machine path keeps the heaviest stage's own end slices (no - rho W)",
     "fill_step(m, w, L, u[rows], least[rows], extra[rows])", "fill_step(m, w, L, u[rows], np.inf, extra[rows])"),
    (SLICE, "a slicing row's machine path prices the end slices at the dearest option",
     "        u = np.minimum(alpha[:, 0, :].min(axis=1), alpha[ar, last, :].min(axis=1))",
     "        u = np.minimum(alpha[:, 0, :].max(axis=1), alpha[ar, last, :].max(axis=1))"),
    (SLICE, "the end stages' bound counts the heaviest middle stage's layers in the other middle stages' fill",
     "        T = np.maximum(T, m * Zc + fill0 + drain1 + rest * min(uf, ul) + hop[0])",
     "        T = np.maximum(T, m * Zc + fill0 + drain1 + mid * min(uf, ul) + hop[0])"),
    (SLICE, "the paths through the end stages count the last stage's layers among the middle's too",
     "        ends = ends + (L - a_ - b_) * z(mid)", "        ends = ends + (L - a_) * z(mid)"),
    (SLICE, "the paths through the end stages take the dearest cut's position (max for min over x')",
     "        V = c[:, 0, :] if k == 0 else np.maximum(V[:, :, None], c).min(axis=1)",
     "        V = c[:, 0, :] if k == 0 else np.maximum(V[:, :, None], c).max(axis=1)"),
    (SLICE, "the middle's layers split by bottleneck interval: each option holds one stage's worth (its stages dropped)",
     "            holds = cap * np.minimum(np.floor(upper[..., None] / A + 1e-9), room)",
     "            holds = np.minimum(np.floor(upper[..., None] / A + 1e-9), room)"),
    (SLICE, "the middle's least sum per slice fills the dearest option first",
     '    order = np.argsort(z, axis=0, kind="stable")', '    order = np.argsort(-z, axis=0, kind="stable")'),
    (SLICE, "the end stages' bound counts every hop of the pool chain twice over",
     "    return best / coef.inst.job.seq_length", "    return 2 * best / coef.inst.job.seq_length"),
    ("milp_plan/solvers/bounds.py", "coupled_budget_bound caps the dear type's stages one below what the budget allows",
     "                                 type_caps={dear: d_max})", "                                 type_caps={dear: d_max - 1})"),
    ("milp_plan/solvers/bounds.py", "least_usd_per_hour_with fills the other stages from the dearest pool first",
     "key=lambda q: (price[q], q)):", "key=lambda q: (-price[q], q)):"),
    (PIPE, "a path round's objective floor 1% above what the last run proved",
     "            self.be.add(self.v.objective >= math.ceil(bound - 1e-9))",
     "            self.be.add(self.v.objective >= math.ceil(bound * 1.01))"),
    ("milp_plan/solvers/bounds.py", "coupled_cost_bound prices from one dear stage above the fewest a plan needs",
     "    least = min(least_usd_per_hour_with(coef, dear, d) for d in range(lo, most + 1))",
     "    least = min(least_usd_per_hour_with(coef, dear, d) for d in range(lo + 1, most + 2))"),
    ("milp_plan/solvers/driver.py", "a recomputing config's twin dominates it whatever its memory",
     "            if j is None or min(theirs.layer_room(j, s) for s in worst) < most:",
     "            if j is None or min(theirs.layer_room(j, s) for s in worst) < 0:"),
    ("milp_plan/solvers/bounds.py", "the end stages' others counted one stage short (pp - 2 besides the end)",
     "most = _others_most(runs, self.slots, i, self.pp - 1)", "most = _others_most(runs, self.slots, i, self.pp - 2)"),
    ("milp_plan/solvers/bounds.py", "an end's least time takes the most recomputes, not the fewest memory allows",
     "    return min(t(n, lo), t(n, n))", "    return max(t(n, lo), t(n, n))"),
    ("milp_plan/solvers/bounds.py", "stage 0's tail read a chunk past the layers the others leave",
     "                    firsts.append((t0, max(0.0, d(n) + e - self.base)))",
     "                    firsts.append((t0, max(0.0, d(n + 1) + e - self.base)))"),
    ("milp_plan/solvers/bounds.py", "the chain path through the last stage weighs its time m times (not m - 1/v)",
     "(m - w_chain) * last + hops", "m * last + hops"),
    ("milp_plan/solvers/bounds.py", "stage 0's options kept by time alone (the fastest's tail for all)",
     "        if not out or up < out[-1][1]:", "        if not out:"),
    (COEF, "a room memoised by the first of its positions alone (FitsKey too coarse)",
     "frozenset(self._position(s) for s in positions)", "frozenset(self._position(s) for s in positions[:1])"),
    ("milp_plan/solvers/bounds.py", "an end's least time memoised without its layer count",
     '("least time", coef.memory_key(coef.options[o], s), n)', '("least time", coef.memory_key(coef.options[o], s), 1)'),
    (COEF, "a free config's undominated options memoised without the worst positions' in-flight counts",
     "worst = frozenset(self._position(s) for s in self._worst()) if cfg.complete else None", "worst = None"),
    ("milp_plan/solvers/bounds.py", "the last stage's tail path takes the fill's forwards as whole stage times (lo dropped)",
     "    w, own = lo * path.fwd[0], path.fwd[-1]", "    w, own = path.fwd[0], path.fwd[-1]"),
    ("milp_plan/solvers/bounds.py", "the last stage's tail path counts each hop twice",
     " + path.hop[0] * hops / 2 + opt", " + path.hop[0] * hops + opt"),
    ("milp_plan/solvers/bounds.py", "both ends on one node type only where it hosts three stages (not two)",
     "and not (i0 == i1 and self.hosts[i0] >= 2)", "and not (i0 == i1 and self.hosts[i0] >= 3)"),
    (SCHED, "the last stage's tail path takes every earlier stage's whole first chunk (forward and backward)",
     "        bwd = [0.0] * last + [float(m)]", "        bwd = list(fwd)"),
    (PARENT, "the GPU-budget bound's vertex split puts one layer on every stage (pp, not pp - 1)",
     "        d = (-lam * C + (pp - 1) * (2.0 * math.sqrt(lam)", "        d = (-lam * C + pp * (2.0 * math.sqrt(lam)"),
    (PARENT, "the GPU-budget bound's capacity takes each type's least efficient option",
     "            omega[r] = min(omega.get(r, math.inf), a * opt.group)", "            omega[r] = max(omega.get(r, 0.0), a * opt.group)"),
    (PARENT, "the GPU-budget bound reads an interval of Z at its left end's stage sum",
     "        s = sums.get(b)\n        if s is None:\n            s = sums[b] = extra + max(least_layer_sum(b,",
     "        s = sums.get(a)\n        if s is None:\n            s = sums[a] = extra + max(least_layer_sum(a,"),
    (PARENT, "the GPU-budget bound's per-layer floor counts one layer too many",
     "    s_inf = max(least_layer_sum(math.inf, C, pp, L), L * a_min)", "    s_inf = max(least_layer_sum(math.inf, C, pp, L), (L + 1) * a_min)"),
    (PARENT, "the GPU-budget bound's steady period starts a layer past the largest stage's least",
     "    z_lo = max(L / C, a_min * math.ceil(L / pp))", "    z_lo = max(L / C, a_min * (math.ceil(L / pp) + 1))"),
    (COEF, "a memory fit's parts drop the head's in-flight activations",
     "b.c + inflight * p.c + emb * self.embedding + head * self.head)", "b.c + inflight * p.c + emb * self.embedding)"),
    (COEF, "a memory fit's per-in-flight part keeps a full recompute's working layer (counted per micro-batch)",
     "_affine(lambda n, r: act(n, r, 1.0) - act(n, r, 0.0), full)", "_affine(lambda n, r: act(n, r, 1.0), full)"),
    (COEF, "every option's room at once leaves out what recomputing every layer saves (rho < 0)",
     "per = np.where(full & (rho < 0), per + rho, per)", "per = np.where(full & (rho < 0), per, per)"),
    ("milp_plan/solvers/bounds.py", "the full bound stops at a weight pair short of what the search asked (enough)",
     "            if best >= enough:\n                break", "            if best >= 0.97 * enough:\n                break"),
    ("milp_plan/solvers/bounds.py", "the full bound lifts no point within 1% below what the search asked (enough)",
     "got < min(best, enough) and ends", "got < min(best, 0.99 * enough) and ends"),
    (SCHED, "the drain path counts one backward more on rank 0 before its last forward",
     '        bwd[0] = sum(a.kind == "B" for a in first[:i + 1]) / v',
     '        bwd[0] = (1 + sum(a.kind == "B" for a in first[:i + 1])) / v'),
    ("milp_plan/solvers/bounds.py", "the two-stage bound reads a stage's forward as its whole stage time",
     "    f = np.min([(t.a - b.a) * n + (t.rho - b.rho) * r + (t.c - b.c) for r in rs], axis=0)",
     "    f = np.min([t.a * n + t.rho * r + t.c for r in rs], axis=0)"),
    ("milp_plan/solvers/bounds.py", "the two-stage bound counts each hop twice",
     "w[4] * hop + w[5] * wrap", "w[4] * 2 * hop + w[5] * wrap"),
    ("milp_plan/solvers/bounds.py", "the two-stage bound adds both stages' optimizer steps (they run side by side)",
     "e, q = E[:, :, None], np.maximum(q0, q1)", "e, q = E[:, :, None], q0 + q1"),
    ("milp_plan/solvers/bounds.py", "a stage's most layers: the first alternative under its room replaces the rooms before it",
     "                v = max(v, most)\n                break", "                v = most\n                break"),
    (PIPE, "a pool's stages sum to at most one bottleneck, not beta of them (add_pool_work cuts plans)",
     "be.add(lhs <= be.sum([beta * zb for beta, zb in parts if beta]))",
     "be.add(lhs <= be.sum([zb for beta, zb in parts if beta]))", CLOSED),
    (PIPE, "a stage's pair flows leave out its own pool (two stages in a row on one pool lost)",
     "be.add(be.sum([pair(p, q) for q in self.P]) == self._on_pool(s, p))",
     "be.add(be.sum([pair(p, q) for q in self.P if q != p]) == self._on_pool(s, p))"),
    (FREE_START, "free_start keeps the surplus layers (its plan holds more than L: the checker rejects it)",
     "        layers[s] -= cut\n", "        layers[s] -= 0\n"),
    (FREE_START, "free_start scores plans over a limit or memory",
     "if limits.admit(plan) and matches_pins(inst, coef.pins, plan):", "if matches_pins(inst, coef.pins, plan):"),
    (SLICE, "quick_bound ignores its work limit (the default's decision unbudgeted)",
     "        if stage == last or dl.expired() or (rl is not None and rl.expired()):",
     "        if stage == last or (rl is not None and rl.expired()):"),
    (SLICE, "quick_bound refines whatever refine_if says",
     "            last, refine_if = (5 if refine_if(key) else 4), None", "            last, refine_if = 5, None"),
    ("milp_plan/solvers/backends.py", "a CP-SAT run closed at stop_at reports its objective as proven",
     'return BackendRun("closed", solver.objective_value, solver.best_objective_bound, solver.value, wall, work)',
     'return BackendRun("closed", solver.objective_value, solver.objective_value, solver.value, wall, work)'),
    ("milp_plan/solvers/driver.py", "a run closed near the bound is kept however far its plan is priced above it",
     '        far = run.status == "closed" and value > lb * (1 + PROOF_TOL / 2)',
     '        far = False and run.status == "closed" and value > lb * (1 + PROOF_TOL / 2)'),
    ("milp_plan/solvers/driver.py", "a sweep's heap records nothing of the bounds it pruned",
     "                if prepared.sweep:   # for the sweep", "                if False:   # for the sweep"),
    ("milp_plan/solvers/parallel.py", "--workers' full bounds asked for less than the search's incumbent",
     "apply_async(_full_bound, (cfg, lb, enough, budget_enough, slot))",
     "apply_async(_full_bound, (cfg, lb, enough * 0.98, budget_enough, slot))"),
    ("milp_plan/solvers/driver.py", "a complete config's full bound from a worker read under another incumbent",
     "if got is not None and (same or (not cfg.complete and got.full is not None)):",
     "if got is not None and (same or got.full is not None):"),
    ("milp_plan/solvers/parallel.py", "a root process's guesses cut below the incumbent they are asked under",
     "_bounds(prep.coef(i), lb, incumbent * (1 - rel_eps), incumbent)",
     "_bounds(prep.coef(i), lb, incumbent * (1 - rel_eps) * 0.98, incumbent)"),
    ("milp_plan/solvers/parallel.py", "--workers' root bounds handed to the search one config off",
     "                out.update(zip(ix, got))", "                out.update(zip(ix, got[1:] + got[:1]))"),
    ("milp_plan/solvers/parent_bounds.py", "the GPU-budget bound without its fixed terms returned below enough",
     "        if got is None or got >= enough:", "        if got is None or got >= enough * 0.9:"),
    ("milp_plan/solvers/parent_bounds.py", "the GPU-budget bound's Z search stops below enough",
     "or min(tail, lb) >= enough:", "or min(tail, lb) >= enough * 0.9:"),
    ("milp_plan/solvers/parent_bounds.py", "the GPU-budget bound's early exit under a time limit",
     "if enough < math.inf and limits.time_limit_s is None and", "if enough < math.inf and"),
    ("milp_plan/solvers/driver.py", "a search leaves gc's full collections off after it",
     "        gc.set_threshold(*old)", "        pass"),
    ("milp_plan/solvers/driver.py", "the workers' root bounds taken past the bounding's end under a work limit too",
     "found = computed if computed and dl.work is None else {}", "found = computed if computed else {}"),
    (PIPE, "the closed form's reduction tail reads each option's first piece only",
     "self._aff_ticks(p[min(i, len(p) - 1)], s, o)", "self._aff_ticks(p[0], s, o)", CLOSED),
    (PIPE, "the closed form's reduction tail reads the first option's pieces only",
     "for o, p in pieces.items()])", "for o, p in list(pieces.items())[:1]])", CLOSED),
    (PIPE, "the reduction tail hides only the last earlier stage's backward and hop",
     "be.add(x == be.sum([out[-1], v.bwd_up[k], sc * v.h_up[k]]))", "be.add(x == be.sum([0, v.bwd_up[k], sc * v.h_up[k]]))",
     CLOSED),
    ("milp_plan/solvers/parallel.py", "a solve ahead stopped while the incumbent is still its cutoff",
     "            if incumbent.value != cutoff:", "            if incumbent.value == cutoff:"),
    ("milp_plan/solvers/parallel.py", "a worker's stop flag left set after its solve ahead",
     "        watcher.join()\n        deadline_mod.reset()", "        watcher.join()"),
]

PROBE = r'''
import sys, random
sys.path.insert(0, sys.argv[1])
import milp_plan.predict
if sys.argv[3] == "closed-form":  # every plan predicted by the closed form, as plans too large to simulate are
    milp_plan.predict.STEP_SIM_MAX_OPERATIONS = 0
from pathlib import Path
from milp_plan.job import Limits
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.solvers import bruteforce
from milp_plan.solvers.driver import solve
from instances import write_instance, limits_for, assert_agrees, COMPARABLE_BW, HUGE_BW, OBJECTIVES
import tempfile

# the per-config model's redundant rows keep every plan of small three-type free configs, and each
# config's model alone reaches its optimum (tests/test_model_rows.py); free_start's plans are valid,
# priced by the cost model, never below a config's optimum, and a config solved from one returns its
# optimum and a bound (tests/test_free_start.py)
import pytest
import test_model_rows as tmr, test_free_start as tfs
basis = milp_plan.predict.SIMULATED if sys.argv[3] == "simulated" else milp_plan.predict.CLOSED_FORM
with pytest.MonkeyPatch.context() as mp:
    for case in (0, 1):
        tmr.test_every_plan_of_every_free_config_solves_its_model(Path(tempfile.mkdtemp()), mp, case, basis)
    tmr.test_every_free_config_model_alone_reaches_its_optimum(Path(tempfile.mkdtemp()), mp, basis)
tfs.test_free_start_plans_are_valid_priced_and_never_below_the_optimum(Path(tempfile.mkdtemp()))
tfs.test_a_config_solved_from_the_heuristics_plan_returns_its_optimum_and_a_bound(Path(tempfile.mkdtemp()))
tfs.test_the_search_records_no_bound_above_a_configs_optimum(Path(tempfile.mkdtemp()))

# the bounds' memory terms memoised per what they read, against an unmemoised computation
import test_bound_memo
test_bound_memo.test_memory_terms_shared_by_what_they_read_equal_a_fresh_cache()
# the full bound asked for no more than the incumbent: exact below it
for lim in test_bound_memo.LIMITS:
    test_bound_memo.test_the_full_bound_asked_for_enough_is_exact_below_it("default", "gpt3-6.7b", 256, "free", lim)
# every option's room at once (numpy) against each option's own
for args in test_bound_memo.test_every_options_room_at_once_equals_each_options_room.pytestmark[0].args[1]:
    test_bound_memo.test_every_options_room_at_once_equals_each_options_room(*args)
# the memory fits composed from their parts against costmodel.stage_memory_bytes
for args in test_bound_memo.test_memory_fits_from_parts_equal_the_cost_model.pytestmark[0].args[1]:
    test_bound_memo.test_memory_fits_from_parts_equal_the_cost_model(*args)
# the simulated step's bound weights and seed paths against the simulator on random pipelines
from test_paths import test_every_path_weight_pair_bounds_the_simulation, test_every_stage_path_is_a_path
for sched in ("1f1b", "gpipe", "interleaved"):
    test_every_path_weight_pair_bounds_the_simulation(sched)
    test_every_stage_path_is_a_path(sched)
# the last stage's own tail path, and the full bound's reading of it, against the simulator
from test_paths import test_the_last_stages_tail_path_is_a_path, test_the_tail_path_bound_never_exceeds_the_simulation
for sched in ("1f1b", "gpipe", "interleaved", "zb-h1"):
    test_the_last_stages_tail_path_is_a_path(sched)
    test_the_tail_path_bound_never_exceeds_the_simulation(sched)
# the two-stage bound's paths (the drain path among them) and its lift to each config's optimum
from test_paths import (test_the_drain_path_is_a_path, test_the_drain_path_of_a_two_stage_1f1b_by_hand,
                        test_the_two_stage_paths_bound_the_simulation)
for sched in ("1f1b", "gpipe", "interleaved"):
    test_the_drain_path_is_a_path(sched)
    test_the_two_stage_paths_bound_the_simulation(sched)
test_the_drain_path_of_a_two_stage_1f1b_by_hand()
if sys.argv[3] == "simulated":   # the two-stage bound reads the simulated step's paths only
    import test_two_stage_bound
    test_two_stage_bound.test_two_stages_lift_free_bounds_to_their_optimum_and_never_past_it(Path(tempfile.mkdtemp()))
# the tied embedding's all-reduce in the full bound, where it is 40% of the step (tests/test_bounds.py)
import test_bounds
test_bounds.test_bounds_hold_where_the_tied_all_reduce_is_most_of_the_step.hypothesis.inner_test(
    Path(tempfile.mkdtemp()), "megatron", "min-time", None)
test_bounds.test_the_tied_all_reduce_term_is_tight(Path(tempfile.mkdtemp()))
# the end stages' terms of the full bound (tests/test_end_stages.py)
import test_end_stages
test_end_stages.test_least_time_is_the_least_over_the_recompute_counts_that_fit()
test_end_stages.test_end_stages_lift_free_bounds_to_their_optimum_and_never_past_it(Path(tempfile.mkdtemp()))
test_end_stages.test_stage_zero_options_count_their_time_and_tail_together()
# the free search's bound terms: stage counts coupled across node types, recompute pieces
test_bounds.test_the_least_layer_sum_couples_the_stage_counts()
test_bounds.test_recompute_pieces_bound_every_stage_that_fits()
test_bounds.test_the_front_keeps_every_stage_capacity()
# the free parents' GPU-budget bound: against every layer split, Z grid, small pipeline, brute force
import test_parent_bounds as tpb
for args in tpb.test_least_layer_sum_is_the_least_over_every_split.pytestmark[0].args[1]:
    tpb.test_least_layer_sum_is_the_least_over_every_split(*args)
for args in tpb.test_least_step_is_the_least_over_z.pytestmark[0].args[1]:
    tpb.test_least_step_is_the_least_over_z(*args)
for args in tpb.test_least_step_bounds_every_pipeline_of_whole_gpus.pytestmark[0].args[1]:
    tpb.test_least_step_bounds_every_pipeline_of_whole_gpus(*args)
tpb.test_least_layer_sum_by_hand()
tpb.test_least_step_by_hand_where_the_fastest_option_binds()
tpb.test_capacity_is_at_least_what_any_option_per_type_achieves()
for args in tpb.test_budget_bound_asked_for_enough_is_exact_below_it.pytestmark[0].args[1]:
    tpb.test_budget_bound_asked_for_enough_is_exact_below_it(*args)
tpb.test_budget_bound_lifts_a_deep_parent_to_its_optimum(Path(tempfile.mkdtemp()))
# the work bound that orders the families before their weak bound (both objectives, by hand)
test_bounds.test_work_bound_by_hand(Path(tempfile.mkdtemp()))
# the sliced work bound's fill and end paths against the simulator (tests/test_slice_search.py)
import test_slice_search
for tight in (False, True):
    test_slice_search.test_fill_and_end_paths_never_exceed_the_simulated_step(tight)
class _Tmp:   # pytest's tmp_path_factory, as the sliced tests read it
    def mktemp(self, name):
        return Path(tempfile.mkdtemp())
# the counts a placed count bounds in the work bound (scale_from), on unlike per-type speeds
test_slice_search.test_scaled_placements_with_unlike_speeds(_Tmp())
# each slicing row's full bound (its paths and the heaviest stage's machine path) against every plan's
for make, batch in (("tiny", 1), ("two_speed", 1), ("tiny", 2)):
    test_slice_search.test_full_bound_of_each_slicing_never_exceeds_its_plans(_Tmp(), make, batch)
# the end stages' bound of each count (WorkBounds.end_steps) against every plan's simulated step
for make, batch in (("two_speed", 1), ("tiny", 1), ("two_speed", 2)):
    test_slice_search.test_end_stage_bound_of_each_count_never_exceeds_its_plans(_Tmp(), make, batch)
# the default decision's budget and its refinement in one search
test_slice_search.test_quick_bound_budget_and_refinement_in_one_search(_Tmp())
# a CP-SAT run stopped at stop_at (a config closed at its bound) keeps CP-SAT's own bound
import test_backends
test_backends.test_cpsat_stops_at_the_first_solution_at_or_below_stop_at()
# ... and a run closed near its bound returns the config's optimum (brute force), or solves on
import test_model_rows
with pytest.MonkeyPatch.context() as mp:
    test_model_rows.test_a_run_closed_near_the_bound_returns_the_optimum_or_solves_on(Path(tempfile.mkdtemp()), mp)
# a sweep's solve records the bounds its heap pruned, a single solve does not
import test_pareto_memo
test_pareto_memo.test_only_a_sweep_records_the_bounds_its_heap_pruned()
# a search runs without gc's full collections and restores the thresholds after it
import test_solve
with pytest.MonkeyPatch.context() as mp:
    test_solve.test_a_search_runs_without_full_collections_and_restores_the_thresholds(mp)
# --workers: free mode's bounds computed ahead in forked workers give the search's own answer
import test_parallel
from milp_plan.job import Objective
_free = build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256), Objective(mode="free"))
assert (test_parallel._outcome(_free, None, 2, 2.5, _free.objective.limits())
        == test_parallel._outcome(_free, None, 1, 2.5, _free.objective.limits()))
test_parallel.test_a_wall_clock_limit_that_ends_the_bounding_keeps_the_workers_bounds()
# ... under an incumbent that moves, with the root processes' guesses read too
_job = build_instance(InstanceSpec(model="gpt3-2.7b", global_batch_size=80), Objective(mode="free"))
_one = test_parallel._moving_outcome(_job, 1)
assert test_parallel._moving_outcome(_job, 2) == _one
with pytest.MonkeyPatch.context() as mp:
    _seen = []
    mp.setattr(test_parallel.parallel.BoundWorkers, "root_bounds",
               test_parallel.patient(test_parallel.parallel.BoundWorkers.root_bounds, _seen))
    assert test_parallel._moving_outcome(_job, 2) == _one and _seen == [20]
# the budget's cap on the dear type's stage count (tests/test_coupled_bound.py), against brute force
import test_coupled_bound as tcb
tcb.test_the_price_of_d_dear_stages_fills_the_rest_with_the_cheapest(Path(tempfile.mkdtemp()))
tcb.test_the_price_of_the_other_stages_takes_the_cheapest_type_first(Path(tempfile.mkdtemp()))
for kw in tcb.test_the_coupled_bound_never_exceeds_the_config_optimum_and_bites.pytestmark[0].args[1]:
    tcb.test_the_coupled_bound_never_exceeds_the_config_optimum_and_bites(Path(tempfile.mkdtemp()), kw)
tcb.test_a_recomputing_config_is_never_better_than_its_dominating_twin(Path(tempfile.mkdtemp()))
tcb.test_the_coupled_cost_bound_never_exceeds_the_config_optimum_and_bites(Path(tempfile.mkdtemp()))
if sys.argv[3] == "simulated":   # critical-path rounds under a budget (the closed form has none)
    import pytest
    with pytest.MonkeyPatch.context() as mp:
        tcb.test_path_rounds_under_a_budget_keep_every_config_optimum(Path(tempfile.mkdtemp()), mp)
# the forward share (lo t <= f <= hi t + excess) on every stage of real configs
from test_paths import test_the_forward_share_holds_on_every_stage
test_the_forward_share_holds_on_every_stage("mixed-128", "gpt3-175b", 8, {"tp": 8, "dp": 1, "mbs": 1})
# GPU-type order: a type in two runs where stages take whole nodes, never where they share
# them (the hand test's 27 ms is the simulated step)
import test_type_order
if sys.argv[3] == "simulated":
    for t in (test_type_order.test_a_type_in_two_runs_is_found_and_proven,
              test_type_order.test_a_shared_node_type_in_two_runs_is_found_and_proven,
              test_type_order.test_a_second_run_pays_for_its_node,
              test_type_order.test_the_interleaved_wrap_between_two_runs_crosses_nodes):
        t(Path(tempfile.mkdtemp()))
# mixed-type stages: the hand optimum, the slowest replica's pace, the model's coefficients of a
# bundle of unequal nodes against the cost model (tests/test_mixed_stages.py)
import test_mixed_stages as tms
if sys.argv[3] == "simulated":   # the hand optimum is the simulated step (19.5 ms without a mixed stage)
    for t in (tms.test_hand_optimum_uses_a_mixed_stage, tms.test_mixed_stage_is_paced_by_its_slowest_replica,
              tms.test_model_coefficients_of_a_mixed_pool_equal_the_cost_model):
        t(Path(tempfile.mkdtemp()))
# every config's model on its own (no heuristic or bound can hide it), each schedule, slow
# links, per-GPU billing, against each config's exhaustive optimum (tests/test_trust.py)
from test_trust import assert_every_config_model_exact
d0 = Path(tempfile.mkdtemp())
spec = write_instance(d0, layers=8, gpn=2, counts=(2, 2), bw=COMPARABLE_BW[1], billing=("gpu", "node"),
                      memory_gb_per_s=1.0)
inst0 = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 8}))
for sched in ("gpipe", "interleaved", "1f1b"):
    for limits in (Limits(), Limits(budget_usd_per_hour=5.9)):
        assert_every_config_model_exact(inst0, limits, "megatron", {"schedule": sched, "recompute": "none"})
rng = random.Random(7)
tmp = Path(tempfile.mkdtemp())
cases = 0
for i in range(400):
    if cases >= int(sys.argv[2]):
        break
    mode = "free" if i % 3 == 2 else "megatron"
    kw = dict(layers=rng.randint(2, 6 if mode == "free" else 8), gpn=rng.choice([1, 2, 4] if mode == "megatron" else [1, 2]),
              counts=(rng.randint(1, 2), rng.randint(1, 2)), third=rng.random() < 0.4,
              prices=(rng.choice([4.0, 8.0]), rng.choice([1.0, 2.0, 6.0])),
              bw=rng.choice(COMPARABLE_BW + ((HUGE_BW, HUGE_BW),)), billing=(rng.choice(["node", "gpu"]), rng.choice(["node", "gpu"])),
              memory_gb_per_s=rng.choice([None, 1.0]),
              memory_gib=tuple(rng.choice([None, None, 0.003, 0.004]) for _ in range(3)))
    f, slow = rng.choice([0.5, 1.0]), rng.choice([1.0, 1.5, 2.5])
    kw.update(fast_ms=(f, 2 * f), slow_ms=(f * slow, 2 * f * slow))
    d = tmp / f"i{i}"; d.mkdir()
    spec = write_instance(d, **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": rng.choice([2, 4, 8])}))
    if sum(bruteforce.count_candidates(inst, c) for c in bruteforce.solved_configs(inst, mode=mode)) > 3000:
        continue
    fastest = bruteforce.solve(inst, Limits(), mode=mode)
    if fastest.plan is None:
        continue
    objective = OBJECTIVES[cases % len(OBJECTIVES)]
    fix = {"schedule": "gpipe"} if (mode == "megatron" and cases % 4 == 3) else None
    if fix:
        fastest = bruteforce.solve(inst, Limits(), fix=fix, mode=mode)
        if fastest.plan is None:
            continue
    limits = limits_for(objective, fastest.plan)
    ref = bruteforce.solve(inst, limits, fix=fix, mode=mode)
    res = solve(inst, limits, backend="cpsat", fix=fix, mode=mode, time_limit_s=60)
    assert_agrees(inst, res, ref, limits)
    cases += 1
inst = build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256))  # issue 21's job (the former default)
from milp_plan.deadline import Deadline
for limits in (Limits(), Limits("min-cost", time_limit_s=7.91984)):
    res = solve(inst, limits, dl=Deadline(3600, work=200))   # deterministic: proven in 5-17 units
    assert res.status == "optimal" and limits.admit(res.plan)
# two stages of 4 GPUs share each node: hops inside a node and between nodes, each schedule
for sched in ("1f1b", "interleaved", "gpipe"):
    # (GPipe holds all 64 micro-batches' activations: it fits only recomputing)
    fix = {"tp": 1, "dp": 4, "pp": 4, "mbs": 1, "recompute": "full" if sched == "gpipe" else "none", "schedule": sched}
    res = solve(inst, Limits(), fix=fix, dl=Deadline(3600, work=200))
    assert res.status == "optimal", (sched, res.status)
# overlapped reductions on the closed-form basis: the model's reduction tail (D >= each piece of
# the option a stage runs as) agrees with the cost model where the second piece decides
if sys.argv[3] == "closed-form":
    import test_overlap
    for intra in (100, 1):
        test_overlap.test_closed_form_basis_with_overlap(Path(tempfile.mkdtemp()), intra)
# a worker's solve ahead stops once the search's incumbent is no longer its cutoff, and only then
import test_parallel
with pytest.MonkeyPatch.context() as mp:
    for args in test_parallel.test_a_solve_ahead_stops_once_the_incumbent_moves.pytestmark[0].args[1]:
        test_parallel.test_a_solve_ahead_stops_once_the_incumbent_moves(mp, *args)
print("probe passed", cases, "random cases")
'''


def run_probe(pkg_root: Path, cases: int, basis: str) -> tuple[bool, str]:
    r = subprocess.run([sys.executable, "-c", PROBE, str(pkg_root), str(cases), basis], capture_output=True, text=True,
                       cwd=ROOT / "tests", env={"PYTHONPATH": f"{pkg_root}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"})
    lines = (r.stdout + r.stderr).strip().splitlines()
    return r.returncode == 0, lines[-1] if lines else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--only", type=int, action="append")
    ap.add_argument("--cases", type=int, default=24, help="random instances per probe")
    args = ap.parse_args()
    if args.list:
        for i, (f, what, *_rest) in enumerate(MUTATIONS):
            print(f"{i:2d}  {f}: {what}")
        return
    with tempfile.TemporaryDirectory() as td:
        base = Path(td) / "base"
        shutil.copytree(ROOT / "milp_plan", base / "milp_plan")
        shutil.copytree(ROOT / "clusters", base / "milp_plan" / "shipped" / "clusters")
        shutil.copytree(ROOT / "profiles", base / "milp_plan" / "shipped" / "profiles")
        for basis in ("simulated", CLOSED):
            t0 = time.perf_counter()
            ok, last = run_probe(base, args.cases, basis)
            print(f"unmutated, {basis}: {'passes' if ok else 'FAILS'} ({time.perf_counter() - t0:.0f} s): {last}")
            if not ok:
                sys.exit(1)
        caught = 0
        chosen = args.only or range(len(MUTATIONS))
        for i in chosen:
            f, what, old, new, *basis = MUTATIONS[i]
            work = Path(td) / f"m{i}"
            shutil.copytree(base, work)
            path = work / f
            text = path.read_text()
            if text.count(old) != 1:
                print(f"{i:2d}  SKIPPED (pattern not found once): {what}")
                continue
            path.write_text(text.replace(old, new))
            t0 = time.perf_counter()
            ok, last = run_probe(work, args.cases, basis[0] if basis else "simulated")
            caught += not ok
            print(f"{i:2d}  {'caught  ' if not ok else 'SURVIVED'} {what} ({time.perf_counter() - t0:.0f} s)"
                  + (f": {last[:160]}" if not ok else ""))
            shutil.rmtree(work)
        print(f"caught {caught} of {len(list(chosen))} mutations")


if __name__ == "__main__":
    main()
