package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
)

// explain prints, for each endpoint of a cluster, why a connected node
// gets what it gets: where the endpoint came from, which rule put it on
// its network, whether it was kept, replaced by gateways or dropped, and
// the weights. It reads /debug/networkz?explain= of the running host,
// which is the trace the endpoint pipeline records while it computes what
// the xDS server sends.
func explain(args []string) int {
	if len(args) > 0 && args[0] == "service" {
		return explainService(args[1:]) // explain_service.go
	}
	if len(args) == 0 || args[0] != "endpoint" {
		fmt.Fprintln(os.Stderr, "usage: estuary explain endpoint --node ID --cluster 'outbound|PORT||HOST' [--admin ADDR] [--json]")
		fmt.Fprintln(os.Stderr, "       estuary explain service HOST --node ID [--admin ADDR] [--json]")
		fmt.Fprintln(os.Stderr, "       (an east-west gateway's clusters are named outbound_.PORT_._.HOST)")
		return 2
	}
	fs := flag.NewFlagSet("explain endpoint", flag.ContinueOnError)
	node := fs.String("node", "", "node id of a connected client (see /debug/adsz)")
	cluster := fs.String("cluster", "", "cluster, e.g. outbound|8080||echo.default.svc.cluster.local")
	admin := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *node == "" || *cluster == "" {
		fmt.Fprintln(os.Stderr, "--node and --cluster are required")
		return 2
	}
	q := url.Values{"explain": {*cluster}, "node": {*node}}
	body, err := admin.get("/debug/networkz", q)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *asJSON {
		os.Stdout.Write(body)
		return 0
	}
	var ex pipeline.Explanation
	if err := json.Unmarshal(body, &ex); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	printExplanation(os.Stdout, &ex)
	return 0
}

func printExplanation(w io.Writer, ex *pipeline.Explanation) {
	mode := "multi-network off"
	if ex.MultiNetwork {
		mode = fmt.Sprintf("multi-network on, weight scale factor %d", ex.ScaleFactor)
	}
	fmt.Fprintf(w, "node %s (%s)\ncluster %s: %s (network generation %d)\n", ex.Node, ex.View, ex.Cluster, mode, ex.Generation)
	if ex.TLS != nil {
		printClusterTLS(w, ex.TLS)
	}
	fmt.Fprintf(w, "\nENDPOINTS IN THE REGISTRIES (%d)\n", len(ex.Endpoints))
	for _, e := range ex.Endpoints {
		net := e.Network
		if net == "" {
			net = "(unknown)"
		}
		fmt.Fprintf(w, "%s  locality %s  tls %s%s\n", e.Endpoint, e.Locality, e.TLSMode, endpointTLS(ex.TLS, e.TLSMode))
		fmt.Fprintf(w, "  origin:   instance %s, cluster %s, network %s by rule %s\n", e.Instance, e.Cluster, net, e.Rule)
		fmt.Fprintf(w, "  decision: %s", e.Decision)
		if len(e.Gateways) > 0 {
			fmt.Fprintf(w, " %s", strings.Join(e.Gateways, ", "))
		}
		fmt.Fprintln(w)
		if e.Arithmetic != "" {
			fmt.Fprintf(w, "  weights:  %s\n", e.Arithmetic)
		}
	}
	fmt.Fprintf(w, "\nWHAT THE NODE GETS (%d)\n", len(ex.Result))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tWEIGHT\tLOCALITY\tNETWORK\tCLUSTER\tWEIGHT ARITHMETIC\tPRIORITY")
	for _, r := range ex.Result {
		arith := r.Arithmetic
		if r.Gateway {
			arith = "gateway: " + arith
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\n", r.Endpoint, r.Weight, r.Locality, r.Network, r.Cluster, arith, r.Priority)
	}
	tw.Flush()
	if len(ex.Priorities) > 0 {
		fmt.Fprintf(w, "\nPRIORITIES RELATIVE TO THE CLIENT'S LOCALITY %s (locality failover)\n", ex.ClientLocality)
		for _, p := range ex.Priorities {
			fmt.Fprintf(w, "priority %d  %s: %s (Istio's raw priority %d)\n", p.Priority, p.Locality, p.Match, p.Raw)
		}
	}
	if ex.Node != "" {
		fmt.Fprintln(w)
		if diff := compareReceived(ex); diff == "" {
			fmt.Fprintln(w, "This matches what the xDS server holds for the node.")
		} else {
			fmt.Fprintf(w, "The xDS server holds something else for the node (a push may be pending):\n%s", diff)
		}
	}
	for _, n := range ex.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// compareReceived diffs the explanation's result with what the server
// holds for the node, endpoint and weight.
func compareReceived(ex *pipeline.Explanation) string {
	var want, got []string
	for _, r := range ex.Result {
		want = append(want, fmt.Sprintf("%s weight %d", r.Endpoint, r.Weight))
	}
	for _, r := range ex.Received {
		got = append(got, fmt.Sprintf("%s weight %d", r.Endpoint, r.Weight))
	}
	slices.Sort(want)
	slices.Sort(got)
	if slices.Equal(want, got) {
		return ""
	}
	return fmt.Sprintf("  explained: %s\n  held:      %s\n", strings.Join(want, ", "), strings.Join(got, ", "))
}

// printClusterTLS prints what a cluster carries for TLS and why, and
// whether the cluster the server holds carries the same.
func printClusterTLS(w io.Writer, t *model.ClusterTLS) {
	fmt.Fprintf(w, "tls %s", t.TLS)
	if t.SNI != "" {
		fmt.Fprintf(w, ", SNI %s", t.SNI)
	}
	if len(t.SANs) > 0 {
		fmt.Fprintf(w, ", peers %s", strings.Join(t.SANs, " "))
	}
	fmt.Fprintf(w, "\n  why: %s\n", t.Reason)
	if s := t.Served; s != nil {
		if s.TLS == t.TLS && s.SNI == t.SNI {
			fmt.Fprintln(w, "  the cluster the xDS server holds carries the same.")
		} else {
			fmt.Fprintf(w, "  the xDS server holds tls %s, SNI %q (a push may be pending)\n", s.TLS, s.SNI)
		}
	}
}

// endpointTLS says what an endpoint of tlsMode gets from a cluster whose
// TLS is t: with AUTO, Envoy picks the transport socket by the endpoint's
// tlsMode metadata.
func endpointTLS(t *model.ClusterTLS, tlsMode string) string {
	if t == nil {
		return ""
	}
	switch t.TLS {
	case model.ClusterTLSMutual:
		return " -> Istio mTLS"
	case model.ClusterTLSAuto:
		if tlsMode == "istio" {
			return " -> Istio mTLS (match tlsMode-istio)"
		}
		return " -> plain text (match tlsMode-disabled)"
	}
	return " -> plain text"
}
