// Package shm is the staging directory where the server's dump hook leaves one file per
// request: watching it, telling complete dumps from partial ones, and accounting its usage.
package shm
