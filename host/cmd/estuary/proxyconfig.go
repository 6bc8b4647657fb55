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
	if len(args) == 0 || args[0] != "endpoints" {
		fmt.Fprintln(os.Stderr, "usage: estuary proxy-config endpoints --node ID [--cluster NAME] [--admin ADDR]")
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
