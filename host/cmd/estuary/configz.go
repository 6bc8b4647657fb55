package main

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk/redact"
)

// effectiveConfig is /debug/configz: the file as the host understood it,
// with defaults filled in and each plugin's decoded config block. A plugin
// shows the block it runs, as running returns it; "running" is false
// until it accepted one, and "file" holds the file's block while the
// plugin runs an earlier one (it refused the file's, or has not taken it
// yet).
//
// Nothing secret is shown: attributes a plugin's schema marks sensitive
// read "(sensitive)", URLs lose their credentials, a plugin's env shows
// only its variables' names, and durations read as in the file ("30s").
func effectiveConfig(f *config.File, running func(label string) (*config.Plugin, bool)) any {
	type pluginView struct {
		*config.Plugin
		Config any `json:"config"`
		// These shadow the embedded block's fields of the same JSON name.
		Env         []string    `json:"env,omitempty"`
		SyncTimeout string      `json:"sync_timeout"`
		Running     bool        `json:"running"`
		File        *pluginView `json:"file,omitempty"`
	}
	view := func(p *config.Plugin) pluginView {
		v := pluginView{Plugin: p, Config: rawJSON(p.ConfigView()), SyncTimeout: p.SyncTimeout.String()}
		for k := range p.Env {
			v.Env = append(v.Env, k+"=("+redact.Placeholder+")")
		}
		slices.Sort(v.Env)
		return v
	}
	plugins := make([]pluginView, 0, len(f.Plugins))
	for _, p := range f.Plugins {
		v := view(p)
		if run, latest := running(p.Label); run != nil {
			file := v
			v = view(run)
			v.Running = true
			if !latest {
				v.File = &file
			}
		}
		plugins = append(plugins, v)
	}
	out := map[string]any{
		"file": f.Filename,
		"mesh": struct {
			config.Mesh
			ExportTo []string `json:"default_service_export_to"` // kept outside config.Mesh, shown in it
		}{f.Mesh, f.DefaultServiceExportTo},
		"xds":     humanDurations(f.XDS),
		"admin":   humanDurations(f.Admin),
		"plugins": plugins,
	}
	if f.Locality.Failover != nil { // written in the mesh block
		out["locality"] = f.Locality
	}
	return out
}

// humanDurations returns v (a config struct) as JSON would encode it,
// except that every time.Duration field, at any depth, reads as written in
// plugins.hcl ("30s") rather than in nanoseconds, and every string loses
// its URL credentials. It follows the fields' json tags, so a field added
// to the struct needs nothing here.
func humanDurations(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var m any
	if err := json.Unmarshal(b, &m); err != nil {
		return v
	}
	return overlay(reflect.ValueOf(v), m)
}

var durationType = reflect.TypeFor[time.Duration]()

// overlay walks the Go value rv and its decoded JSON m in step.
func overlay(rv reflect.Value, m any) any {
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return m
		}
		rv = rv.Elem()
	}
	switch {
	case rv.Type() == durationType:
		return time.Duration(rv.Int()).String()
	case rv.Kind() == reflect.String:
		if s, ok := m.(string); ok {
			return redact.Text(s)
		}
	case rv.Kind() == reflect.Struct:
		obj, ok := m.(map[string]any)
		if !ok {
			return m
		}
		for i := 0; i < rv.NumField(); i++ {
			sf := rv.Type().Field(i)
			name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
			if sf.Anonymous && name == "" {
				// An embedded struct's fields are the object's own.
				overlay(rv.Field(i), obj)
				continue
			}
			if name == "-" || !sf.IsExported() {
				continue
			}
			if name == "" {
				name = sf.Name
			}
			if jv, ok := obj[name]; ok {
				obj[name] = overlay(rv.Field(i), jv)
			}
		}
	case rv.Kind() == reflect.Slice || rv.Kind() == reflect.Array:
		if list, ok := m.([]any); ok {
			for i := 0; i < rv.Len() && i < len(list); i++ {
				list[i] = overlay(rv.Index(i), list[i])
			}
		}
	case rv.Kind() == reflect.Map:
		if obj, ok := m.(map[string]any); ok {
			iter := rv.MapRange()
			for iter.Next() {
				if k, ok := iter.Key().Interface().(string); ok {
					if jv, ok := obj[k]; ok {
						obj[k] = overlay(iter.Value(), jv)
					}
				}
			}
		}
	}
	return m
}
