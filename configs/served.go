package configs

import (
	"strconv"
	"strings"
)

// LayersString is the captured layer list as dump and output metadata write it: "2,30,58".
func (c *Config) LayersString() string {
	parts := make([]string, len(c.Server.Layers))
	for i, l := range c.Server.Layers {
		parts[i] = strconv.Itoa(l)
	}
	return strings.Join(parts, ",")
}

// ServedModel is the model path the server is launched with, which every dump names in
// its metadata; the simulator stands in as "simulator" unless a path is set.
func (c *Config) ServedModel() string {
	if c.Server.Kind == "simulator" && c.Server.ModelPath == "" {
		return "simulator"
	}
	return c.Server.ModelPath
}
