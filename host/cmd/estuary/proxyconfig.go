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
// host's admin server, like `istioctl proxy-config endpoints|clusters`.
func proxyConfig(args []string) int {
	if len(args) == 0 || (args[0] != "endpoints" && args[0] != "clusters") {
		fmt.Fprintln(os.Stderr, "usage: estuary proxy-config endpoints|clusters --node ID [--cluster NAME] [--admin ADDR] [--json]")
		return 2
	}
	if args[0] == "clusters" {
		var rows []model.ClusterTLS
		return proxyConfigRows(args, "/debug/proxyclusterz", &rows, func(tw *tabwriter.Writer) {
			// What the cluster builder decided, next to what the
			// cluster the server holds carries.
			fmt.Fprintln(tw, "CLUSTER\tTLS\tSNI\tMODE\tHELD\tWHY")
			for _, r := range rows {
				held := "-"
				if r.Served != nil {
					held = r.Served.TLS
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Cluster, r.TLS, r.SNI, r.Mode, held, r.Reason)
			}
		})
	}
	var rows []model.EndpointRow
	return proxyConfigRows(args, "/debug/proxyendpointz", &rows, func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "ENDPOINT\tSTATUS\tWEIGHT\tLOCALITY\tNETWORK\tREGISTRY CLUSTER\tCLUSTER\tPRIORITY")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\n", r.Endpoint, r.Health, r.Weight, r.Locality, r.Network, r.Registry, r.Cluster, r.Priority)
		}
	})
}

// proxyConfigRows runs one proxy-config subcommand (args[0]): it reads
// path from the admin server for --node (and --cluster), and prints the
// body as it is with --json, or decodes it into rows and prints the table.
func proxyConfigRows(args []string, path string, rows any, table func(*tabwriter.Writer)) int {
	fs := flag.NewFlagSet("proxy-config "+args[0], flag.ContinueOnError)
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
	body, err := admin.get(path, q)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *asJSON {
		os.Stdout.Write(body)
		return 0
	}
	if err := json.Unmarshal(body, rows); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	table(tw)
	tw.Flush()
	return 0
}
