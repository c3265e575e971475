//go:build slurm

package e2e

// The binary these tests run is built with the tag of this test binary.
func init() { binTags = append(binTags, "slurm") }
