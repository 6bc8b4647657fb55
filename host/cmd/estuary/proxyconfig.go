package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"text/tabwriter"

	"github.com/estuary-mesh/estuary/host/model"
)

// proxyConfig prints what a connected node receives, read from the running
// host's admin server, like `istioctl proxy-config endpoints`.
func proxyConfig(args []string) int {
	if len(args) > 0 && args[0] == "clusters" {
		return proxyConfigClusters(args[1:])
	}
	if len(args) == 0 || args[0] != "endpoints" {
		fmt.Fprintln(os.Stderr, "usage: estuary proxy-config endpoints|clusters --node ID [--cluster NAME] [--admin ADDR] [--json]")
		return 2
	}
	fs := flag.NewFlagSet("proxy-config endpoints", flag.ContinueOnError)
	node := fs.String("node", "", "node id of a connected client (see /debug/adsz)")
	cluster := fs.String("cluster", "", "only this cluster, e.g. outbound|8080||echo.default.svc.cluster.local")
	admin := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *node == "" {
		fmt.Fprintln(os.Stderr, "--node is required")
		return 2
	}
	q := url.Values{"node": {*node}}
	if *cluster != "" {
		q.Set("cluster", *cluster)
	}
	body, err := admin.get("/debug/proxyendpointz", q)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *asJSON {
		os.Stdout.Write(body)
		return 0
	}
	var rows []model.EndpointRow
	if err := json.Unmarshal(body, &rows); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tSTATUS\tWEIGHT\tLOCALITY\tNETWORK\tREGISTRY CLUSTER\tCLUSTER\tPRIORITY")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\n", r.Endpoint, r.Health, r.Weight, r.Locality, r.Network, r.Registry, r.Cluster, r.Priority)
	}
	tw.Flush()
	return 0
}

// proxyConfigClusters prints the TLS of each cluster a connected node
// receives: what it carries, its SNI, and why, as the cluster builder
// decided it, next to what the cluster the server holds carries.
func proxyConfigClusters(args []string) int {
	fs := flag.NewFlagSet("proxy-config clusters", flag.ContinueOnError)
	node := fs.String("node", "", "node id of a connected client (see /debug/adsz)")
	cluster := fs.String("cluster", "", "only this cluster, e.g. outbound|8080||echo.default.svc.cluster.local")
	admin := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *node == "" {
		fmt.Fprintln(os.Stderr, "--node is required")
		return 2
	}
	q := url.Values{"node": {*node}}
	if *cluster != "" {
		q.Set("cluster", *cluster)
	}
	body, err := admin.get("/debug/proxyclusterz", q)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *asJSON {
		os.Stdout.Write(body)
		return 0
	}
	var rows []model.ClusterTLS
	if err := json.Unmarshal(body, &rows); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tTLS\tSNI\tMODE\tHELD\tWHY")
	for _, r := range rows {
		held := "-"
		if r.Served != nil {
			held = r.Served.TLS
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Cluster, r.TLS, r.SNI, r.Mode, held, r.Reason)
	}
	tw.Flush()
	return 0
}
