package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
)

// TestPrintExplanationTLS: the human form of explain shows the cluster's
// TLS and why, what each endpoint gets by its tlsMode, and says so when
// the held cluster carries something else.
func TestPrintExplanationTLS(t *testing.T) {
	tls := &model.ClusterTLS{TLS: model.ClusterTLSAuto, SNI: "outbound_.8080_._.echo.default.svc.cluster.local",
		Reason: "mesh mode PERMISSIVE: transport_socket_matches", Served: &model.ServedTLS{TLS: model.ClusterTLSAuto, SNI: "outbound_.8080_._.echo.default.svc.cluster.local"}}
	ex := &pipeline.Explanation{TLS: tls, Trace: pipeline.Trace{Endpoints: []pipeline.TracedEndpoint{
		{Endpoint: "10.0.0.1:8080", TLSMode: "istio"}, {Endpoint: "10.0.0.2:8080", TLSMode: "disabled"},
	}}}
	var b bytes.Buffer
	printExplanation(&b, ex)
	for _, want := range []string{
		"tls AUTO, SNI outbound_.8080_._.echo.default.svc.cluster.local\n  why: mesh mode PERMISSIVE: transport_socket_matches",
		"the cluster the xDS server holds carries the same",
		"10.0.0.1:8080  locality   tls istio -> Istio mTLS (match tlsMode-istio)",
		"10.0.0.2:8080  locality   tls disabled -> plain text (match tlsMode-disabled)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("explain output lacks %q:\n%s", want, b.String())
		}
	}
	tls.Served.TLS = model.ClusterTLSNone
	b.Reset()
	printExplanation(&b, ex)
	if !strings.Contains(b.String(), "the xDS server holds tls NONE") {
		t.Errorf("a held cluster that differs is not reported:\n%s", b.String())
	}
}
