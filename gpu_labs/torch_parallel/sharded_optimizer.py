"""ZeRO-1 for any torch optimizer: each rank keeps the optimizer state of its share of the
parameters only.

    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)

Every parameter is owned by one rank (assigned greedily, largest first, to the rank that
owns the fewest elements so far). Each rank's inner optimizer (``optimizer_cls`` over its
own parameters) steps them; then every parameter is broadcast from its owner, so all
ranks end with the same values. Gradients must already be averaged over the ranks (DDP,
or an all-reduce) when ``step`` runs. ``add_param_group`` shares a new group out the same
way. Optimizer memory per rank falls to about 1/n; the traffic is a broadcast of the
parameters (what the all-gather of ZeRO-1 moves, organised by parameter).
"""

import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, group=None, **kwargs):
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner = {}  # id(parameter) -> rank of the group that steps it
        self._load = [0] * self.size
        self.local = None
        super().__init__(params, defaults=kwargs)  # calls add_param_group for every group

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in sorted(group["params"], key=lambda p: -p.numel()):
            r = min(range(self.size), key=lambda k: (self._load[k], k))
            self.owner[id(p)], self._load[r] = r, self._load[r] + p.numel()
            if r == self.rank:
                mine.append(p)
        mine = [p for p in group["params"] if id(p) in {id(q) for q in mine}]  # in the group's order
        options = {k: v for k, v in group.items() if k != "params"}
        if self.local is None:
            self.local = self.optimizer_cls([{"params": mine, **options}], **self.kwargs)
        else:
            self.local.add_param_group({"params": mine, **options})

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.local.step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                src = self.owner[id(p)]
                dist.broadcast(p, src=dist.get_global_rank(self.group, src) if self.group else src, group=self.group)
        return loss

    def state_bytes(self):
        """Bytes of optimizer state this rank holds."""
        return sum(v.numel() * v.element_size() for st in self.local.state.values() for v in st.values()
                   if torch.is_tensor(v) and v.dim() > 0)
