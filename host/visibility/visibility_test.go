package visibility_test

import (
	"strings"
	"testing"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/host/visibility"
	"github.com/estuary-mesh/estuary/sdk"
)

func svc(provider, ns string, exportTo ...string) *aggregate.Service {
	return &aggregate.Service{
		Service:   &sdk.Service{Hostname: "h.example", Namespace: ns, ExportTo: exportTo},
		Instances: []replica.InstanceKey{{Plugin: "p", Provider: provider, Cluster: "c1"}},
	}
}

// TestDecide restates Istio's rules: "." is the service's own namespace,
// "*" every namespace, "~" none, a name that namespace only (a service
// exported only elsewhere is not seen in its own namespace); a service
// without exportTo takes the mesh default; a node without a namespace
// sees only what is exported to all.
func TestDecide(t *testing.T) {
	private := &visibility.Rules{Default: []string{"."}}
	tests := []struct {
		name   string
		rules  *visibility.Rules
		svc    *aggregate.Service
		ns     string
		want   bool
		source string
		reason string
	}{
		{"dot, own namespace", nil, svc(sdk.ProviderServiceEntry, "a", "."), "a", true, visibility.SourceServiceEntry, `"." exports it`},
		{"dot, other namespace", nil, svc(sdk.ProviderServiceEntry, "a", "."), "b", false, visibility.SourceServiceEntry, `namespace "b" is not in its exportTo`},
		{"star", nil, svc(sdk.ProviderKubernetes, "a", "*"), "z", true, visibility.SourceAnnotation, `"*" exports it`},
		{"named, that namespace", nil, svc(sdk.ProviderStatic, "a", "b"), "b", true, visibility.SourceStatic, `exported to namespace "b" by name`},
		{"named elsewhere, own namespace", nil, svc(sdk.ProviderStatic, "a", "b"), "a", false, visibility.SourceStatic, `namespace "a" is not`},
		{"dot and a name", nil, svc(sdk.ProviderServiceEntry, "a", ".", "c"), "c", true, visibility.SourceServiceEntry, "by name"},
		{"tilde", nil, svc(sdk.ProviderServiceEntry, "a", "~"), "a", false, visibility.SourceServiceEntry, `"~" exports it to no namespace`},
		{"unset, no mesh default: all", nil, svc(sdk.ProviderKubernetes, "a"), "q", true, visibility.SourceMeshDefault, `"*"`},
		{"unset, mesh default dot, other", private, svc(sdk.ProviderKubernetes, "a"), "q", false, visibility.SourceMeshDefault, "not in its exportTo"},
		{"unset, mesh default dot, own", private, svc(sdk.ProviderKubernetes, "a"), "a", true, visibility.SourceMeshDefault, "own namespace"},
		{"set beats the mesh default", private, svc(sdk.ProviderKubernetes, "a", "*"), "q", true, visibility.SourceAnnotation, `"*"`},
		{"node without namespace, dot", nil, svc(sdk.ProviderKubernetes, "", "."), "", false, visibility.SourceAnnotation, "names no namespace"},
		{"node without namespace, star", nil, svc(sdk.ProviderKubernetes, "a", "*"), "", true, visibility.SourceAnnotation, `"*"`},
		{"third-party registry", nil, svc("Nomad", "a", "."), "a", true, "export_to of the Nomad registry", "own namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.rules.Decide(tt.svc, tt.ns)
			if d.Visible != tt.want || d.Source != tt.source || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("Decide = %+v, want visible %v from %q because ...%s...", d, tt.want, tt.source, tt.reason)
			}
			if got := tt.rules.Visible(tt.svc, tt.ns); got != tt.want {
				t.Errorf("Visible = %v, Decide says %v", got, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		list []string
		want []string // one per error: index and a piece of the message
	}{
		{[]string{"."}, nil},
		{[]string{"*"}, nil},
		{[]string{"~"}, nil},
		{[]string{".", "istio-system", "b"}, nil},
		{[]string{"*", "a"}, []string{`[0]: "*" cannot be combined`}},
		{[]string{"a", "~"}, []string{`[1]: "~" cannot be combined`}},
		{[]string{"a", "a"}, []string{`[1]: "a" is listed twice`}},
		{[]string{"Bad_NS"}, []string{`[0]: "Bad_NS" is not`}},
		{[]string{""}, []string{`[0]: "" is not`}},
	}
	for _, tt := range tests {
		errs := visibility.Validate(tt.list)
		if len(errs) != len(tt.want) {
			t.Errorf("Validate(%q) = %v, want %d errors", tt.list, errs, len(tt.want))
			continue
		}
		for i, e := range errs {
			if !strings.Contains(e.Error(), tt.want[i]) {
				t.Errorf("Validate(%q)[%d] = %v, want %q", tt.list, i, e, tt.want[i])
			}
		}
	}
}
