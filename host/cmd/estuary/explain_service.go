package main

import (
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/estuary-mesh/estuary/host/visibility"
)

// explainService prints whether a node sees a service, and why: the
// service's exportTo and where it came from, the instances that report
// it, and the clusters the xDS server holds for the node. It reads
// /debug/visibilityz of the running host, which asks the same rules the
// xDS server filters with.
func explainService(args []string) int {
	fs := flag.NewFlagSet("explain service", flag.ContinueOnError)
	node := fs.String("node", "", "node id (see /debug/adsz); its namespace decides")
	admin := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	// HOST comes first, as in istioctl; flags may follow it.
	host := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		host, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if host == "" && fs.NArg() > 0 {
		host = fs.Arg(0)
	}
	if host == "" || *node == "" {
		fmt.Fprintln(os.Stderr, "usage: estuary explain service HOST --node ID [--admin ADDR] [--json]")
		return 2
	}
	return show(admin, "/debug/visibilityz", url.Values{"host": {host}, "node": {*node}}, *asJSON, printServiceExplanation)
}

func printServiceExplanation(w io.Writer, ex *visibility.Explanation) {
	ns := ex.Namespace
	if ns == "" {
		ns = "(none)"
	}
	conn := "connected"
	if !ex.Connected {
		conn = "not connected: namespace read from its id"
	}
	verdict := "DOES NOT SEE"
	if ex.Visible {
		verdict = "SEES"
	}
	fmt.Fprintf(w, "node %s (%s), namespace %s\n", ex.Node, conn, ns)
	fmt.Fprintf(w, "%s service %s (namespace %s)\n", verdict, ex.Hostname, ex.ServiceNamespace)
	fmt.Fprintf(w, "  exportTo: %s, from %s\n", strings.Join(ex.ExportTo, ", "), ex.Source)
	fmt.Fprintf(w, "  because:  %s\n", ex.Reason)
	for i, in := range ex.Instances {
		role := "reports it"
		if i == 0 {
			role = "reports it; its attributes win"
		}
		fmt.Fprintf(w, "  instance: %s (provider %s, cluster %s) %s\n", in.Plugin, in.Provider, in.Cluster, role)
	}
	for _, c := range ex.Conflicts {
		fmt.Fprintf(w, "  conflict: %s\n", c)
	}
	if !ex.Connected {
		return
	}
	if len(ex.Received) == 0 {
		fmt.Fprintln(w, "  the xDS server holds no cluster of it for the node")
	} else {
		fmt.Fprintf(w, "  the xDS server holds for the node: %s\n", strings.Join(ex.Received, ", "))
	}
	if ex.Visible == (len(ex.Received) > 0) {
		fmt.Fprintln(w, "This matches what the xDS server holds for the node.")
	} else {
		fmt.Fprintln(w, "The xDS server holds something else for the node (a push may be pending).")
	}
}
