# Estuary: build, run and test.
# `make run` serves the static sample services; `make test` runs every test,
# building the real test infrastructure (kube-apiserver, etcd, consul) first.

GO        ?= go
BIN       ?= bin
ESTUARY   := $(BIN)/estuary
CONFIG    ?= plugins.hcl
GOFLAGS   += -buildvcs=false
export GOFLAGS
# The repository holds four Go modules: the root (host, plugins, xds), the
# plugin contract (proto), the SDK plugin authors import (sdk), and a
# third-party plugin built on the SDK alone (examples/plugin-hello).
MODULES   := . proto sdk examples/plugin-hello

.PHONY: all build run test test-unit bench bench-fleet soak proto plugins lint testbed tools image clean

all: build

build:
	$(GO) build -o $(ESTUARY) ./host/cmd/estuary

run: build
	$(ESTUARY) run -config $(CONFIG)

# testbed builds kube-apiserver, etcd and consul from the Go module proxy into
# $$HOME/.cache/estuary (once per version); tests start them on loopback.
testbed:
	bash testbed/build.sh

# tools builds helm and crane, pinned in deploy/tools/go.mod (a module of its own,
# so neither the root module nor the SDK requires them), into
# $$HOME/.cache/estuary/tools (once per version). The deploy/ tests use them.
tools:
	bash deploy/tools/build.sh helm crane >/dev/null

# image builds the estuary image, an OCI image layout in a tarball, without a
# Docker daemon (crane; deploy/image.sh). Push it with
# `crane push $(IMAGE) REGISTRY/estuary:TAG`; deploy/Dockerfile builds the
# same image where a daemon exists.
IMAGE     ?= $(BIN)/estuary-image.tar
image:
	bash deploy/image.sh $(IMAGE)

test: testbed tools
	for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	for m in $(MODULES); do (cd $$m && $(GO) test -race -count=1 -timeout 40m ./...) || exit 1; done

bench:
	for m in $(MODULES); do (cd $$m && $(GO) test -run '^$$' -bench . -benchmem -timeout 60m ./...) || exit 1; done

# soak runs the real host under churn (endpoints, services, plugin kills,
# client reconnect waves) with SOAK_CLIENTS xDS clients for SOAK_DURATION,
# printing its heap, goroutines, fds and RSS every SOAK_INTERVAL, and fails
# if they grow or any client loses configuration. Not part of `make test`:
# the test file has the `soak` build tag. See testbed/README.md.
SOAK_DURATION ?= 1h
SOAK_CLIENTS  ?= 1000
SOAK_TIMEOUT  ?= 80m
soak:
	SOAK_DURATION=$(SOAK_DURATION) SOAK_CLIENTS=$(SOAK_CLIENTS) \
		$(GO) test -tags soak -run '^TestSoak$$' -count=1 -timeout $(SOAK_TIMEOUT) -v ./host/cmd/estuary/

# bench-fleet runs the real host with FLEET_CLIENTS xDS clients, each on
# its own connection, against a real kube-apiserver and the static plugin,
# and reports start-up, memory per client, convergence of one change to
# every client, CPU per change and a reconnect storm. Not part of
# `make test`: the test file has the `fleet` build tag. FLEET_SOURCES,
# FLEET_SERVICES, FLEET_ENDPOINTS, FLEET_PUSHES, FLEET_DEBOUNCE,
# FLEET_STORM, FLEET_ESTUARY and FLEET_PROFILE are passed through from the
# environment; see testbed/README.md.
FLEET_CLIENTS ?= 1000
bench-fleet: testbed
	FLEET_CLIENTS=$(FLEET_CLIENTS) \
		$(GO) test -tags fleet -run '^TestFleet$$' -count=1 -timeout 30m -v ./host/cmd/estuary/

proto:
	protoc --version
	protoc -I proto \
		--plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
		--plugin=protoc-gen-go-grpc="$$($(GO) tool -n protoc-gen-go-grpc)" \
		--plugin=protoc-gen-go-vtproto="$$($(GO) tool -n protoc-gen-go-vtproto)" \
		--go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
		--go-vtproto_out=proto --go-vtproto_opt=paths=source_relative,features=marshal+unmarshal+size \
		proto/registry/v1/registry.proto

# plugins builds each bundled plugin as a standalone binary, with SHA256SUMS
# for the `sha256` attribute of an external plugin block.
plugins:
	mkdir -p $(BIN)/plugins
	for p in static kubernetes consul serviceentry; do \
		$(GO) build -o $(BIN)/plugins/estuary-plugin-$$p ./plugins/$$p/cmd/estuary-plugin-$$p || exit 1; \
	done
	cd examples/plugin-hello && $(GO) build -o $(CURDIR)/$(BIN)/plugins/estuary-plugin-hello .
	cd $(BIN)/plugins && sha256sum estuary-plugin-* > SHA256SUMS

# staticcheck is pinned as a tool of the root module and run on every
# module from there, so the SDK's module never requires it.
lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	sc="$$($(GO) tool -n staticcheck)" && for m in $(MODULES); do (cd $$m && "$$sc" ./...) || exit 1; done
	$(GO) vet -tags soak ./host/cmd/estuary/
	"$$($(GO) tool -n staticcheck)" -tags soak ./host/cmd/estuary/
	$(GO) vet -tags fleet ./host/cmd/estuary/
	"$$($(GO) tool -n staticcheck)" -tags fleet ./host/cmd/estuary/

clean:
	rm -rf $(BIN)
