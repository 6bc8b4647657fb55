package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/estuary-mesh/estuary/host/admin"
	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/host/pipeline"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/host/supervisor"
	"github.com/estuary-mesh/estuary/xds"
)

func runHost(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	path := fs.String("config", "plugins.hcl", "configuration file")
	level := fs.String("log-level", "info", "trace, debug, info, warn or error")
	jsonLogs := fs.Bool("log-json", false, "log JSON lines")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "estuary", Level: hclog.LevelFromString(*level), JSONFormat: *jsonLogs, Output: os.Stderr})

	file, diags := load(*path)
	if diags.HasErrors() {
		fmt.Fprint(os.Stderr, config.Format(diags))
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		logger.Error("cannot find the estuary executable to run bundled plugins", "error", err)
		return 1
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	store := replica.NewStore(reg)
	agg := aggregate.New(store, reg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sup := supervisor.NewSupervisor(ctx, supervisor.Options{Self: self}, logger, store, reg)
	adm := admin.New(logger, reg, agg, sup)

	var mu sync.Mutex
	current := file
	adm.Config = func() any {
		mu.Lock()
		defer mu.Unlock()
		return effectiveConfig(current)
	}

	// The network manager follows the aggregate before the xDS server does,
	// so a registry change updates gateways before it is pushed.
	nets := network.New(agg, logger, network.Options{})
	netCfg, _ := loadNetworks(file) // load validated it
	nets.Apply(netCfg)
	eds := pipeline.New(agg, nets, logger)
	xs := xds.New(xds.Options{Listen: file.XDS.Listen, DebounceAfter: file.XDS.DebounceAfter, DebounceMax: file.XDS.DebounceMax}, agg, eds, logger, reg)
	nets.OnChange(func() { xs.Notify(model.Change{Full: true}) })
	go nets.Run(ctx)
	adm.Handle("/debug/networkz", eds.Handler(xs))
	for path, h := range xs.DebugHandlers() {
		adm.Handle(path, h)
	}
	xdsAddr, err := xs.Start(ctx)
	if err != nil {
		logger.Error("cannot start the xDS server", "error", err)
		return 1
	}
	defer xs.Stop()
	adminAddr, err := adm.Listen(file.Admin.Listen)
	if err != nil {
		logger.Error("cannot start the admin server", "error", err)
		return 1
	}
	for _, d := range sup.Apply(file) {
		logger.Warn("plugin config", "problem", d.Error())
	}
	fmt.Fprintf(os.Stderr, "estuary %s: xDS (ADS) on %s; admin on http://%s (/readyz, /metrics, /debug/registryz); %d plugin(s)\n",
		Version, xdsAddr, adminAddr, len(file.Plugins))

	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	for sig := range signals {
		if sig == syscall.SIGHUP {
			logger.Info("SIGHUP: reloading", "config", *path)
			next, diags := load(*path)
			if diags.HasErrors() {
				logger.Error("reload rejected; keeping the running configuration", "errors", "\n"+config.Format(diags))
				continue
			}
			if next.XDS.Listen != file.XDS.Listen || next.Admin.Listen != file.Admin.Listen {
				logger.Warn("listen addresses change only on restart")
			}
			if d := sup.Apply(next); d.HasErrors() {
				logger.Error("some plugins kept their previous config", "errors", "\n"+config.Format(d))
			}
			if nc, d := loadNetworks(next); d.HasErrors() {
				logger.Error("networks kept their previous config", "errors", "\n"+config.Format(d))
			} else {
				nets.Apply(nc)
			}
			mu.Lock()
			current = next
			mu.Unlock()
			logger.Info("reload applied", "plugins", len(next.Plugins))
			continue
		}
		logger.Info("shutting down", "signal", sig.String())
		break
	}
	signal.Stop(signals)
	done := make(chan struct{})
	go func() {
		sup.Stop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		logger.Warn("plugins did not stop within 10s")
	}
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer scancel()
	_ = adm.Shutdown(sctx)
	return 0
}

// effectiveConfig is /debug/configz: the file as the host understood it,
// with defaults filled in and each plugin's decoded config block.
func effectiveConfig(f *config.File) any {
	type pluginView struct {
		*config.Plugin
		Config any `json:"config"`
	}
	plugins := make([]pluginView, 0, len(f.Plugins))
	for _, p := range f.Plugins {
		plugins = append(plugins, pluginView{Plugin: p, Config: rawJSON(p.ConfigJSON)})
	}
	return map[string]any{
		"file":    f.Filename,
		"mesh":    f.Mesh,
		"xds":     f.XDS,
		"admin":   f.Admin,
		"plugins": plugins,
	}
}
