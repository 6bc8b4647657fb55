//go:build !unix

package config

import "os"

// fileOwner is unknown where files have no uid.
func fileOwner(os.FileInfo) (uint32, bool) { return 0, false }
