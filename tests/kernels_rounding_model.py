"""A float64 model of the Triton chunk kernels' forward + backward that rounds to a 16-bit format exactly where the
kernels cast (bf16/fp16 operands and stores; float32 accumulation is taken as exact). With no rounding it is the
chunkwise gradient algebra of kernels/delta_product/chunk_bwd.py in plain PyTorch, so it checks those formulas
independently of Triton; with rounding it predicts the error a correct kernel should have in 16 bits, which is
what the GPU tolerances of test_kernels_triton.py are set from (the interpreter cannot run bf16).
Not a test module: test_kernels_rounding.py uses it.
"""
import torch


STAGES = ("w", "u", "t", "h", "v_new", "dv_loc", "dh", "dv_new")  # the kernels' intermediate tensors (Kd is
# formed inside the state walks, chunk_h._kd_tile: no tensor of it to compare)


def model_grads(q, k, v, beta, g, h0, do, dht, n, scale, r, stages=None):
    """Equal-length sequences, q [B,T,H,K], k/v [B,T*n,H,*], beta [B,T*n,H], g [B,T,H] or None, h0/dht [B,H,K,V],
    do [B,T,H,V], r the rounding (identity, or to bf16/fp16 and back). Returns dq, dk, dv, dbeta (float64).
    With `stages` (a dict), also fills stages[name] with the intermediates in the kernels' layout [NC, H, ...]
    (chunk c of sequence b is row b * chunks_per_sequence + c), so each kernel can be checked on its own."""
    B, T, H, K = q.shape; V = v.shape[-1]
    BT = 64 // n  # tokens per chunk, as kernels/delta_product/index.py
    L = 64
    dq = torch.zeros_like(q); dk = torch.zeros_like(k); dv = torch.zeros_like(v); db = torch.zeros_like(beta)
    for b in range(B):
        for hh in range(H):
            NC = -(-T // BT)
            ch = []
            for c in range(NC):
                t0, t1 = c * BT, min(T, (c + 1) * BT); nt = t1 - t0; ns = nt * n
                kc = torch.zeros(L, K, dtype=torch.float64); kc[:ns] = k[b, t0*n:t1*n, hh]
                vc = torch.zeros(L, V, dtype=torch.float64); vc[:ns] = v[b, t0*n:t1*n, hh]
                bc = torch.zeros(L, dtype=torch.float64); bc[:ns] = beta[b, t0*n:t1*n, hh]
                qc = torch.zeros(BT, K, dtype=torch.float64); qc[:nt] = q[b, t0:t1, hh]
                doc = torch.zeros(BT, V, dtype=torch.float64); doc[:nt] = do[b, t0:t1, hh]
                gi = torch.zeros(L, dtype=torch.float64)
                if g is not None: gi[0:ns:n] = g[b, t0:t1, hh]
                G = gi.cumsum(0); GL = G[-1]
                lo = torch.arange(L); strict = lo[:, None] > lo[None, :]
                E = torch.where(strict, (G[:, None] - G[None, :]).clamp(max=0).exp(), torch.zeros(()).double())
                A = bc[:, None] * (kc @ kc.T) * E
                Tm = torch.linalg.inv(torch.eye(L, dtype=torch.float64) + A)
                Tr = r(Tm)
                X = r(kc * (bc * G.exp())[:, None]); Y = r(vc * bc[:, None])
                W = r(Tr @ X); U = r(Tr @ Y); Kd = r(kc * (GL - G).exp()[:, None])
                it = torch.arange(BT) * n + n - 1; mt = torch.arange(BT) < nt
                Gq = torch.where(mt, G[it], torch.zeros(()).double())
                ms = (lo[None, :] <= it[:, None]) & mt[:, None]
                Dec = torch.where(ms, (Gq[:, None] - G[None, :]).clamp(max=0).exp(), torch.zeros(()).double())
                ch.append(dict(kc=kc, vc=vc, bc=bc, qc=qc, doc=doc, G=G, GL=GL, E=E, Tr=Tr, X=X, Y=Y, W=W, U=U, Kd=Kd,
                               Gq=Gq, ms=ms, Dec=Dec, t0=t0, t1=t1, nt=nt, ns=ns))
            # forward states
            S = h0[b, hh].clone()
            for c in ch:
                c["h"] = r(S)
                c["vn"] = r(c["U"] - c["W"] @ r(S))
                S = S * c["GL"].exp() + c["Kd"].T @ c["vn"]
            # dv_local, serial dh
            dS = dht[b, hh].clone()
            for c in reversed(ch):
                s = r((c["kc"] @ c["qc"].T) * c["Dec"].T * scale)
                dvloc = r(s @ r(c["doc"]))
                c["dvloc"] = dvloc
                c["dh"] = r(dS)
                dvn = dvloc + c["Kd"] @ r(dS)
                c["dvn"] = r(dvn)
                qg = r(c["qc"] * (scale * c["Gq"].exp())[:, None])
                dS = dS * c["GL"].exp() + qg.T @ r(c["doc"]) - c["W"].T @ r(dvn)
            # dqkwg
            for c in ch:
                kc, vc, bc, qc, G = c["kc"], c["vc"], c["bc"], c["qc"], c["G"]
                h, dh, vn, dvn, do_ = c["h"], c["dh"], c["vn"], c["dvn"], r(c["doc"])
                Tt = c["Tr"].T
                dqS = do_ @ h.T; dP = do_ @ vn.T; dka = vn @ dh.T; dW = -dvn @ h.T
                dY = Tt @ dvn; dvc = r(dY * bc[:, None]); dbc = (dY * vc).sum(1)
                dT = dvn @ r(vc * bc[:, None]).T
                ed = (c["GL"] - G).exp(); dkc = dka * ed[:, None]
                D = torch.where(c["ms"], dP * c["Dec"], torch.zeros(()).double()) * scale
                Dc = r(D)
                dqc = dqS * (scale * c["Gq"].exp())[:, None] + Dc @ kc
                dkc = dkc + Dc.T @ qc
                dWc = r(dW); eG = G.exp()
                dT = dT + dWc @ r(kc * (bc * eG)[:, None]).T
                dX = Tt @ dWc; xk = (dX * kc).sum(1); dkc = dkc + dX * (bc * eG)[:, None]
                dA = r(Tt @ r(dT)) @ Tt
                dA = torch.where(torch.arange(64)[:, None] > torch.arange(64)[None, :], -dA, torch.zeros(()).double())
                KK = (kc @ kc.T) * c["E"]
                dbc = dbc + xk * eG + (dA * KK).sum(1)
                Bm = r(dA * c["E"] * bc[:, None])
                dkc = dkc + (Bm + Bm.T) @ kc
                t0, t1, nt, ns = c["t0"], c["t1"], c["nt"], c["ns"]
                dq[b, t0:t1, hh] = r(dqc[:nt]); dk[b, t0*n:t1*n, hh] = r(dkc[:ns])
                dv[b, t0*n:t1*n, hh] = dvc[:ns]; db[b, t0*n:t1*n, hh] = dbc[:ns]
            if stages is not None:
                for ci, c in enumerate(ch):
                    vals = dict(w=c["W"], u=c["U"], kd=c["Kd"], t=c["Tr"], h=c["h"], v_new=c["vn"],
                                dv_loc=c["dvloc"], dh=c["dh"], dv_new=c["dvn"])
                    for name, x in vals.items():
                        stages.setdefault(name, {})[(b * len(ch) + ci, hh)] = x
    return dq, dk, dv, db


def stage_tensor(stages: dict, name: str, NC: int, H: int) -> torch.Tensor:
    """stages[name] as one [NC, H, ...] tensor."""
    return torch.stack([torch.stack([stages[name][(c, h)] for h in range(H)]) for c in range(NC)])
