package main

import (
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/hashicorp/hcl/v2"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
	"github.com/estuary-mesh/estuary/sdk/redact"
)

// load reads and fully validates a config file: HCL, host blocks, bundled
// plugin config blocks against their schemas, external binaries' hashes,
// the networks block.
func load(path string) (*config.File, hcl.Diagnostics) {
	return validated(config.Load(path, catalog.Names()))
}

// decodeCaches keep each plugin's decoded config blocks between loads of
// the file, by plugin label, so that a reload decodes only what changed.
type decodeCaches map[string]*configschema.Cache

// attach gives each plugin of f its label's cache, and forgets the caches
// of labels f no longer has.
func (c decodeCaches) attach(f *config.File) {
	if f == nil {
		return
	}
	labels := map[string]bool{}
	for _, p := range f.Plugins {
		labels[p.Label] = true
		if c[p.Label] == nil {
			c[p.Label] = &configschema.Cache{}
		}
		p.DecodeCache = c[p.Label]
	}
	for l := range c {
		if !labels[l] {
			delete(c, l)
		}
	}
}

// validated adds to a parsed file's diagnostics what only the command can
// check: the plugins' own schemas and the networks block. The test of the
// documented examples runs READMEs' HCL through it too.
func validated(f *config.File, diags hcl.Diagnostics) (*config.File, hcl.Diagnostics) {
	if f != nil && !diags.HasErrors() {
		diags = append(diags, catalog.Validate(f)...)
		diags = append(diags, config.CheckXDSTLSFiles(&f.XDS)...)
	}
	if f != nil {
		_, d := loadNetworks(f)
		diags = append(diags, d...)
		redactDiagnostics(f, diags)
	}
	return f, diags
}

// redactDiagnostics removes the file's sensitive values (the attributes
// plugins' schemas mark sensitive) and URL credentials from diags, which
// `estuary validate`, a failed start and a rejected reload print.
func redactDiagnostics(f *config.File, diags hcl.Diagnostics) {
	secrets := &redact.Secrets{}
	for _, p := range f.Plugins {
		secrets.Add(p.SensitiveValues()...)
	}
	for _, d := range diags {
		d.Summary, d.Detail = secrets.String(d.Summary), secrets.String(d.Detail)
	}
}

func validate(args []string) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	path := fs.String("config", "plugins.hcl", "configuration file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	f, diags := load(*path)
	if len(diags) > 0 {
		fmt.Fprint(os.Stderr, config.Format(diags))
	}
	if diags.HasErrors() {
		fmt.Fprintf(os.Stderr, "%s: %d error(s)\n", *path, countErrors(diags))
		return 1
	}
	external := 0
	for _, p := range f.Plugins {
		if p.External() {
			external++
		}
	}
	fmt.Printf("%s: valid (%d plugins", *path, len(f.Plugins))
	if external > 0 {
		fmt.Printf("; config blocks of %d external plugins are checked when they start", external)
	}
	fmt.Println(")")
	return 0
}

func countErrors(diags hcl.Diagnostics) int {
	n := 0
	for _, d := range diags {
		if d.Severity == hcl.DiagError {
			n++
		}
	}
	return n
}

func listPlugins(args []string) int {
	fs := flag.NewFlagSet("plugins", flag.ContinueOnError)
	path := fs.String("config", "", "also list the plugins this configuration runs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUNDLED\tVERSION\tPROTOCOL\tCAPABILITIES")
	for _, name := range catalog.Names() {
		d, err := catalog.Describe(name)
		if err != nil {
			fmt.Fprintf(tw, "%s\terror: %v\t\t\n", name, err)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%v\n", name, d.Version, sdk.ProtocolVersion, capabilityNames(d.Capabilities))
	}
	tw.Flush()
	if *path == "" {
		return 0
	}
	f, diags := config.Load(*path, catalog.Names())
	if diags.HasErrors() {
		fmt.Fprint(os.Stderr, config.Format(diags))
		return 1
	}
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONFIGURED\tRUNS\tVERSION\tPROTOCOL")
	for _, p := range f.Plugins {
		if p.External() {
			fmt.Fprintf(tw, "%s\t%s (sha256 %.12s…)\t(reported at start, see /debug/pluginz)\t\n", p.Label, p.Path, p.SHA256)
			continue
		}
		d, err := catalog.Describe(p.Bundled)
		if err != nil {
			fmt.Fprintf(tw, "%s\tbundled %s\terror: %v\t\n", p.Label, p.Bundled, err)
			continue
		}
		fmt.Fprintf(tw, "%s\tbundled %s\t%s\t%d\n", p.Label, p.Bundled, d.Version, sdk.ProtocolVersion)
	}
	tw.Flush()
	return 0
}

func capabilityNames(cs []sdk.Capability) []string {
	names := map[sdk.Capability]string{sdk.CapabilityReconfigure: "reconfigure", sdk.CapabilityMultiInstance: "multi-instance", sdk.CapabilityGateways: "gateways"}
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, names[c])
	}
	return out
}
