package report

import (
	"image/color"
	"math"
)

// A Scene is the picture as values: what both the SVG and the PNG draw, so that the
// two show the same thing and the picture is tested without rendering it.
type Scene struct {
	W, H  float64
	Items []Item
}

// Item is a Rect, a Path, a Text or a Group.
type Item interface{ item() }

// Point is a position in the scene, y down.
type Point struct{ X, Y float64 }

// Rect is a filled rectangle.
type Rect struct {
	X, Y, W, H float64
	Fill       color.RGBA // alpha is the fill's opacity (not premultiplied)
}

// Path is a polyline. A NaN point breaks it (a gap in the data).
type Path struct {
	Pts    []Point
	Stroke color.RGBA
	Width  float64
	Dash   float64 // dash and gap length; 0 is solid
}

// Text is one line of text; Y is its baseline.
type Text struct {
	X, Y   float64
	S      string
	Size   float64
	Fill   color.RGBA
	Anchor Anchor
	Bold   bool
}

// Anchor says which end of a Text sits at X.
type Anchor int

// Text anchors.
const (
	Start Anchor = iota
	Middle
	End
)

// Group names its items for a reader of the SVG (class and data attributes, and a
// tooltip); the PNG draws its items and ignores the rest.
type Group struct {
	Class string
	ID    string
	Title string
	Data  map[string]string // data-* attributes
	Items []Item
}

func (Rect) item()  {}
func (Path) item()  {}
func (Text) item()  {}
func (Group) item() {}

// broken is the point that breaks a path.
var broken = Point{math.NaN(), math.NaN()}

func (p Point) isBreak() bool { return math.IsNaN(p.X) || math.IsNaN(p.Y) }

// runs splits a path's points at its breaks; runs of one point are dropped.
func runs(pts []Point) [][]Point {
	var out [][]Point
	start := 0
	for i := 0; i <= len(pts); i++ {
		if i == len(pts) || pts[i].isBreak() {
			if i-start >= 2 {
				out = append(out, pts[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// decimate keeps, of the points that fall in one pixel column, the first, the lowest,
// the highest and the last: the line looks the same with at most four points a
// column, however many records a long job has.
func decimate(pts []Point) []Point {
	out := make([]Point, 0, min(len(pts), 4096))
	for _, run := range runs(pts) {
		if len(out) > 0 {
			out = append(out, broken)
		}
		col := math.Floor(run[0].X)
		first, lo, hi, last := run[0], run[0], run[0], run[0]
		flush := func() {
			keep := []Point{first, lo, hi, last}
			if lo.X > hi.X {
				keep[1], keep[2] = hi, lo
			}
			for _, p := range keep {
				if len(out) == 0 || out[len(out)-1] != p {
					out = append(out, p)
				}
			}
		}
		for _, p := range run[1:] {
			if c := math.Floor(p.X); c != col {
				flush()
				col, first, lo, hi = c, p, p, p
			}
			if p.Y < lo.Y {
				lo = p
			}
			if p.Y > hi.Y {
				hi = p
			}
			last = p
		}
		flush()
	}
	return out
}

// dashes cuts a run into the solid pieces of a dash pattern of dash on, dash off.
func dashes(run []Point, dash float64) [][]Point {
	var out [][]Point
	on, left := true, dash
	cur := []Point{run[0]}
	for i := 1; i < len(run); i++ {
		a, b := run[i-1], run[i]
		seg := math.Hypot(b.X-a.X, b.Y-a.Y)
		for seg > 0 {
			step := math.Min(seg, left)
			t := step / seg
			a = Point{a.X + (b.X-a.X)*t, a.Y + (b.Y-a.Y)*t}
			seg -= step
			left -= step
			if on {
				cur = append(cur, a)
			}
			if left <= 0 {
				if on && len(cur) >= 2 {
					out = append(out, cur)
				}
				on, left = !on, dash
				cur = []Point{a}
			}
		}
	}
	if on && len(cur) >= 2 {
		out = append(out, cur)
	}
	return out
}
