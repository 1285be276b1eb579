"""One-off model of configs 16-18's protocol (k-block pairs): producer, two consumer warpgroups, the stage
ring's full/empty mbarriers and named barriers 3 / 4, under random interleavings. Checks: no deadlock,
each warpgroup reads exactly its k-blocks of each tile in order, no stage is refilled while a warpgroup
may still read it, and warpgroup 0 reads warpgroup 1's partial of the same tile."""
import random

class MBar:
    def __init__(self, count): self.count, self.pending, self.phase = count, count, 0
    def arrive(self):
        self.pending -= 1
        if self.pending == 0: self.phase += 1; self.pending = self.count
    def done(self, parity):  # try_wait.parity: the phase of this parity has completed
        return (self.phase & 1) != parity

class NBar:  # named barrier: sync waits for count arrivals (sync counts as arrival)
    def __init__(self, count): self.count, self.arrived, self.gen = count, 0, 0
    def arrive(self):
        self.arrived += 1
        if self.arrived == self.count: self.arrived = 0; self.gen += 1

def run(S, num_kb, tiles, seed):
    rnd = random.Random(seed)
    full = [MBar(1) for _ in range(S)]; empty = [MBar(2) for _ in range(S)]  # 2 warpgroups (4 warps each -> 1)
    data = [None] * S; readers = [set() for _ in range(S)]
    nb3, nb4 = NBar(2), NBar(2); xchg = [None]; log = {0: [], 1: []}; got = []
    def producer():
        st, ph = 0, 0
        for t in tiles:
            for kb in range(0, num_kb, 2):
                while not empty[st].done(ph ^ 1): yield
                assert not readers[st], "refilled while read"
                two = kb + 1 < num_kb
                data[st] = (t, kb, kb + 1 if two else None)
                full[st].arrive()
                st += 1
                if st == S: st, ph = 0, ph ^ 1
    def consumer(cw):
        st, ph = 0, 0
        for i, t in enumerate(tiles):
            part = []
            for kb in range(cw, num_kb + cw, 2):
                while not full[st].done(ph): yield
                readers[st].add(cw)
                if kb < num_kb:
                    d = data[st]; assert d[0] == t and d[1 + cw] == kb, (d, t, kb, cw)
                    part.append(kb); yield  # the wgmmas run
                readers[st].discard(cw)
                empty[st].arrive()
                st += 1
                if st == S: st, ph = 0, ph ^ 1
            log[cw].append((t, part))
            if cw == 1:
                if i != 0:
                    g = nb4.gen; nb4.arrive()
                    while nb4.gen == g: yield
                xchg[0] = (t, tuple(part)); nb3.arrive()
            else:
                g = nb3.gen; nb3.arrive()
                while nb3.gen == g: yield
                assert xchg[0][0] == t; got.append(xchg[0]); yield
                if i + 1 < len(tiles): nb4.arrive()
    actors = [producer(), consumer(0), consumer(1)]; live = list(actors); steps = 0
    while live:
        a = rnd.choice(live)
        try: next(a)
        except StopIteration: live.remove(a)
        steps += 1
        if steps > 10**6: raise RuntimeError("deadlock")
    for cw in (0, 1):
        assert [t for t, _ in log[cw]] == list(tiles)
        for t, part in log[cw]: assert part == list(range(cw, num_kb, 2))
    assert [t for t, _ in got] == list(tiles)
    assert nb3.arrived == 0 and nb4.arrived == 0

n = 0
for S in (4, 5, 8, 9):
    for num_kb in (1, 2, 3, 8, 9, 33):
        for nt in (1, 2, 3, 7):
            for seed in range(6):
                run(S, num_kb, list(range(seed, seed + 3 * nt, 3)), seed); n += 1
print(f"kpair model: {n} cases passed")
