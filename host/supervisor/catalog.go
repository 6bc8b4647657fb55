// Package plugin supervises registry plugins: it starts each one (a bundled
// plugin by re-executing the estuary binary, an external one from its path
// after checking its sha256), negotiates the protocol over go-plugin with
// AutoMTLS, forwards the plugin's logs, streams its state into the host's
// replica, and restarts it with backoff when it dies. While a plugin is
// down its instances keep serving their last-known state.
package supervisor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk"
)

// Catalog is the set of bundled plugins, by name. Bundled and external
// plugins share the sdk.Factory type; bundled ones are served by the same
// binary re-executed as `estuary plugin NAME`.
type Catalog map[string]sdk.Factory

// Names lists the bundled plugins, sorted.
func (c Catalog) Names() []string {
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Describe asks a bundled plugin to describe itself, in process. Factories
// must not start work before Configure, so this starts nothing.
func (c Catalog) Describe(name string) (*sdk.DescribeResponse, error) {
	f, ok := c[name]
	if !ok {
		return nil, fmt.Errorf("no bundled plugin named %q", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p := f(sdk.Runtime{Context: ctx, Logger: hclog.NewNullLogger(), State: sdk.NewState()})
	return p.Describe(ctx, &sdk.DescribeRequest{})
}

// Validate checks everything about a file that can be checked without
// starting a plugin: bundled plugins' config blocks against their schemas,
// and external plugins' binaries against their sha256. External plugins'
// config blocks are checked when they start.
func (c Catalog) Validate(f *config.File) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, p := range f.Plugins {
		if p.External() {
			diags = append(diags, config.VerifyBinary(p)...)
			continue
		}
		d, err := c.Describe(p.Bundled)
		if err != nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Cannot describe plugin",
				Detail: fmt.Sprintf("plugin %q: %v", p.Label, err), Subject: p.DeclRange.Ptr()})
			continue
		}
		diags = append(diags, p.DecodeConfig(d.ConfigSchema)...)
	}
	return diags
}

// Serve runs the named bundled plugin in this process; it is what
// `estuary plugin NAME` does.
func (c Catalog) Serve(name string) error {
	f, ok := c[name]
	if !ok {
		return fmt.Errorf("no bundled plugin named %q (have %s)", name, strings.Join(c.Names(), ", "))
	}
	sdk.Serve(f)
	return nil
}
