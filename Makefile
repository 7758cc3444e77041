# rmqtx developer commands. `make help` lists them.
SHELL := /bin/bash
GO ?= go
STATICCHECK_VERSION ?= v0.8.2
PKGS ?= ./...

.PHONY: help up down status logs quickstart demo test test-upstream test-short test-race test-names lint fuzz bench

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

up: ## install (if missing) and start MariaDB, PostgreSQL and RocketMQ on 127.0.0.1
	@bash scripts/services.sh up

down: ## stop the services this repo started
	@bash scripts/services.sh down

status: ## show which services run
	@bash scripts/services.sh status

logs: ## tail the services' logs
	@bash scripts/services.sh logs

quickstart: ## README's program (examples/quickstart) on MariaDB and RocketMQ, started first (DB=postgres: PostgreSQL)
	@case "$(DB)" in \
	  "" | mariadb | mysql) db=mariadb flag= ;; \
	  postgres | postgresql | pg) db=postgres flag=-postgres ;; \
	  *) echo "quickstart: DB is mariadb (default) or postgres, not $(DB)" >&2; exit 2 ;; \
	esac; \
	bash scripts/services.sh up $$db namesrv broker && \
	eval "$$(bash scripts/services.sh env)" && \
	$(GO) run ./examples/quickstart $$flag -namesrv "$$RMQTX_NAMESRV"

demo: ## the main job: start the services and run the end-to-end demo (DB=postgres: on PostgreSQL)
	@DB=$(DB) bash scripts/demo.sh

test: ## the whole suite on a fresh machine: installs, starts services, runs every test
	@bash scripts/test.sh

test-upstream: ## the user's build (upstream client, no replace) only, against running services (make up)
	@RMQTX_VIEWS=upstream bash scripts/test.sh --go-only

test-names: ## rewrite scripts/test-names.txt from the test sources (after adding or renaming a test)
	$(GO) run ./internal/tools/testguard -write-names scripts/test-names.txt

test-short: ## unit tests only, no services needed
	$(GO) test -short -count=1 $(PKGS)

lint: ## gofmt, go vet and staticcheck (third_party/ is upstream's code as is: scripts/client-patch.sh check)
	@out=$$(gofmt -l $$(git ls-files '*.go' ':!third_party')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet -tags failpoints $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -tags failpoints $(PKGS)

fuzz: ## run every fuzz target briefly (FUZZTIME=30000x inputs each)
	@bash scripts/fuzz.sh

bench: ## raw client vs rmqtx, side by side, with ratios, on the upstream client (RMQTX_BENCH_CLIENT=patched; DB=postgres)
	@DB=$(DB) bash scripts/bench.sh
