package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// Plugin is what a registry plugin implements. State is published through
// the [State] handed to the [Factory], not returned from methods.
type Plugin interface {
	// Describe returns the plugin's identity and config schema. It is called
	// before Configure and must not depend on config.
	Describe(ctx context.Context, req *DescribeRequest) (*DescribeResponse, error)
	// Configure applies the decoded config block. It is called once after
	// start and again on every reload; an error keeps the old config. A
	// plugin starts its watches here (in goroutines of its own) and stops
	// them when ctx of Runtime ends.
	Configure(ctx context.Context, req *ConfigureRequest) (*ConfigureResponse, error)
}

// Factory builds a plugin. Bundled and external plugins share it: the host
// binary keeps a map of Factories and re-executes itself to serve one.
type Factory func(rt Runtime) Plugin

// Runtime is what the SDK hands a plugin at start.
type Runtime struct {
	// Context ends when the plugin must shut down.
	Context context.Context
	// Logger writes hclog JSON to stderr; the host forwards it.
	Logger hclog.Logger
	// State receives the plugin's services, endpoints and gateways.
	State *State
}

// Capability is an optional feature of a plugin.
type Capability int

const (
	// CapabilityReconfigure: Configure may be called on a running plugin.
	CapabilityReconfigure Capability = iota + 1
	// CapabilityMultiInstance: the plugin may report several instances.
	CapabilityMultiInstance
	// CapabilityGateways: the plugin reports network gateways.
	CapabilityGateways
	// CapabilityInstanceSet: the plugin says when every instance it will
	// report is declared (State.InstanceSetComplete). Until then a
	// restarted plugin's host keeps serving the instances it had before.
	CapabilityInstanceSet
)

var capabilityNames = [...]string{CapabilityReconfigure: "RECONFIGURE", CapabilityMultiInstance: "MULTI_INSTANCE", CapabilityGateways: "GATEWAYS", CapabilityInstanceSet: "INSTANCE_SET"}

// String names the capability as the protocol does, without its
// CAPABILITY_ prefix: RECONFIGURE, MULTI_INSTANCE, GATEWAYS.
func (c Capability) String() string {
	if c > 0 && int(c) < len(capabilityNames) {
		return capabilityNames[c]
	}
	return fmt.Sprintf("Capability(%d)", int(c))
}

// DescribeRequest is empty today; fields may be added.
type DescribeRequest struct{}

// DescribeResponse identifies the plugin.
type DescribeResponse struct {
	Name         string
	Version      string
	Capabilities []Capability
	// ConfigSchema is the shape of the plugin's `config { }` block.
	ConfigSchema *Schema
}

// ConfigureRequest carries the config block, decoded by the host against the
// plugin's schema.
type ConfigureRequest struct {
	// ConfigJSON is the block as a JSON object: one member per attribute
	// (null when unset), one array member per block type; a labelled block's
	// labels appear as string members named after the schema's label names.
	ConfigJSON []byte
	// Mesh holds mesh-wide defaults from the host's `mesh { }` block.
	Mesh MeshSettings
}

// Decode unmarshals ConfigJSON into v (a struct with json tags).
func (r *ConfigureRequest) Decode(v any) error {
	if len(r.ConfigJSON) == 0 {
		return nil
	}
	return json.Unmarshal(r.ConfigJSON, v)
}

// MeshSettings are mesh-wide defaults.
type MeshSettings struct {
	DomainSuffix string
	// ClusterID is the cluster the host itself runs in.
	ClusterID string
	// Network is the network of ClusterID only: see [MeshSettings.NetworkOf].
	Network string
	// HostAddresses are the addresses the host listens on (xDS and admin),
	// "HOST:PORT" as bound; a host of 0.0.0.0 or :: stands for every
	// address of the machine. A plugin that connects where a third party
	// says (a kubeconfig from a Secret) refuses them, so that nobody can
	// aim the host at its own admin port.
	HostAddresses []string
}

// Equal reports whether m and o are the same settings.
func (m MeshSettings) Equal(o MeshSettings) bool {
	return m.DomainSuffix == o.DomainSuffix && m.ClusterID == o.ClusterID && m.Network == o.Network &&
		slices.Equal(m.HostAddresses, o.HostAddresses)

}

// NetworkOf is the default network mesh settings give an instance of
// cluster: mesh.network when cluster is the host's own cluster
// (mesh.cluster_id), else none. Another cluster's network comes from the
// plugin's own setting or the host's networks block, as a remote cluster's
// does in Istio (its system namespace label or meshNetworks), never from
// the control plane's own network: inheriting it would put every remote
// endpoint on the host's network and defeat from_registry and from_cidr.
func (m MeshSettings) NetworkOf(cluster string) string {
	if cluster != "" && cluster == m.ClusterID {
		return m.Network
	}
	return ""
}

// ConfigureResponse reports problems found in the config.
type ConfigureResponse struct {
	Diagnostics Diagnostics
}

// Severity of a diagnostic.
type Severity int

const (
	SeverityError Severity = iota + 1
	SeverityWarning
)

// Diagnostic is one problem in the config. Path leads from the config block
// to the offending attribute, e.g. ["service", "0", "port", "1", "number"];
// the host turns it into plugins.hcl:LINE:COL.
type Diagnostic struct {
	Severity Severity
	Summary  string
	Detail   string
	Path     []string
}

// Diagnostics is a list of problems.
type Diagnostics []Diagnostic

// Errorf appends an error at path.
func (d *Diagnostics) Errorf(path []string, format string, args ...any) {
	*d = append(*d, Diagnostic{Severity: SeverityError, Summary: sprintf(format, args...), Path: path})
}

// HasErrors reports whether any diagnostic is an error.
func (d Diagnostics) HasErrors() bool {
	for _, x := range d {
		if x.Severity == SeverityError {
			return true
		}
	}
	return false
}

// Error renders the diagnostics, one per line, with their paths.
func (d Diagnostics) Error() string {
	var b []byte
	for i, x := range d {
		if i > 0 {
			b = append(b, '\n')
		}
		b = fmt.Appendf(b, "%s: %s", strings.Join(x.Path, "."), x.Summary)
		if x.Detail != "" {
			b = fmt.Appendf(b, ": %s", x.Detail)
		}
	}
	return string(b)
}

// Stopper is an optional interface for a plugin that runs goroutines of
// its own (the watches Configure starts). Once the host has stopped the
// plugin and Runtime.Context has ended, Serve calls Stop and waits for it:
// Stop returns when every goroutine the plugin started has ended, or with
// ctx's error when ctx (bounded by StopTimeout) ends first. Tests that
// serve a plugin in-process rely on it, so nothing logs after they end.
type Stopper interface {
	Stop(ctx context.Context) error
}

// ValueOr returns *p, or def when p is nil. Attributes left unset arrive as
// null in ConfigJSON and decode into nil pointers; ValueOr applies their
// defaults.
func ValueOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
