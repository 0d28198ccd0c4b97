package report

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"sync"

	"golang.org/x/image/font"
	"golang.org/x/image/font/gofont/gobold"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"
	"golang.org/x/image/math/fixed"
	"golang.org/x/image/vector"
)

// WritePNG writes the report's scene as a PNG image, drawn in Go (the Go fonts, an
// anti-aliasing rasteriser): the same picture as the HTML page's, for a chat or a
// ticket.
func WritePNG(w io.Writer, in Input) error {
	img, err := rasterize(Build(in))
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

func rasterize(s Scene) (*image.RGBA, error) {
	img := image.NewRGBA(image.Rect(0, 0, int(math.Ceil(s.W)), int(math.Ceil(s.H))))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.RGBA{0xfa, 0xfa, 0xfa, 0xff}), image.Point{}, draw.Src)
	r := raster{img: img, faces: map[[2]float64]font.Face{}}
	for _, it := range s.Items {
		if err := r.item(it); err != nil {
			return nil, err
		}
	}
	return img, nil
}

// raster draws a scene; its faces are its own (a face is not safe for concurrent use,
// and the status endpoint may draw two reports at once).
type raster struct {
	img   *image.RGBA
	faces map[[2]float64]font.Face
}

func (r raster) item(it Item) error {
	switch v := it.(type) {
	case Group:
		for _, c := range v.Items {
			if err := r.item(c); err != nil {
				return err
			}
		}
	case Rect:
		rect := image.Rect(int(math.Round(v.X)), int(math.Round(v.Y)), int(math.Round(v.X+v.W)), int(math.Round(v.Y+v.H)))
		src := image.NewUniform(color.NRGBA{v.Fill.R, v.Fill.G, v.Fill.B, v.Fill.A})
		draw.Draw(r.img, rect, src, image.Point{}, draw.Over)
	case Path:
		r.stroke(v)
	case Text:
		face, err := r.face(v.Size, v.Bold)
		if err != nil {
			return err
		}
		x := v.X
		switch adv := float64(font.MeasureString(face, v.S)) / 64; v.Anchor {
		case Middle:
			x -= adv / 2
		case End:
			x -= adv
		}
		d := font.Drawer{Dst: r.img, Src: image.NewUniform(v.Fill), Face: face, Dot: fixed.Point26_6{X: fixed.Int26_6(x * 64), Y: fixed.Int26_6(v.Y * 64)}}
		d.DrawString(v.S)
	}
	return nil
}

// stroke draws a path as one quad per segment and a square at each joint, every one
// wound the same way: overlapping pieces (a line that doubles back) add up instead of
// cancelling out in the rasteriser's accumulation.
func (r raster) stroke(p Path) {
	half := math.Max(p.Width, 1) / 2
	var quads [][4]Point
	quad := func(q [4]Point) {
		area := 0.0
		for i := range q {
			a, c := q[i], q[(i+1)%4]
			area += a.X*c.Y - c.X*a.Y
		}
		if area < 0 {
			q[1], q[3] = q[3], q[1]
		}
		quads = append(quads, q)
	}
	pieces := runs(p.Pts)
	if p.Dash > 0 {
		var dashed [][]Point
		for _, run := range pieces {
			dashed = append(dashed, dashes(run, p.Dash)...)
		}
		pieces = dashed
	}
	for _, run := range pieces {
		for i := 1; i < len(run); i++ {
			a, c := run[i-1], run[i]
			l := math.Hypot(c.X-a.X, c.Y-a.Y)
			if l == 0 {
				continue
			}
			nx, ny := -(c.Y-a.Y)/l*half, (c.X-a.X)/l*half
			quad([4]Point{{a.X + nx, a.Y + ny}, {c.X + nx, c.Y + ny}, {c.X - nx, c.Y - ny}, {a.X - nx, a.Y - ny}})
			if i > 1 && p.Width > 1.5 {
				quad([4]Point{{a.X - half, a.Y - half}, {a.X + half, a.Y - half}, {a.X + half, a.Y + half}, {a.X - half, a.Y + half}})
			}
		}
	}
	if len(quads) == 0 {
		return
	}
	// The rasteriser covers the path's box only: its cost is its area.
	lo, hi := Point{math.Inf(1), math.Inf(1)}, Point{math.Inf(-1), math.Inf(-1)}
	for _, q := range quads {
		for _, c := range q {
			lo = Point{math.Min(lo.X, c.X), math.Min(lo.Y, c.Y)}
			hi = Point{math.Max(hi.X, c.X), math.Max(hi.Y, c.Y)}
		}
	}
	box := image.Rect(int(math.Floor(lo.X))-1, int(math.Floor(lo.Y))-1, int(math.Ceil(hi.X))+1, int(math.Ceil(hi.Y))+1).Intersect(r.img.Bounds())
	if box.Empty() {
		return
	}
	z := vector.NewRasterizer(box.Dx(), box.Dy())
	ox, oy := float64(box.Min.X), float64(box.Min.Y)
	for _, q := range quads {
		z.MoveTo(float32(q[0].X-ox), float32(q[0].Y-oy))
		for _, c := range q[1:] {
			z.LineTo(float32(c.X-ox), float32(c.Y-oy))
		}
		z.ClosePath()
	}
	z.DrawOp = draw.Over
	z.Draw(r.img, box, image.NewUniform(color.NRGBA{p.Stroke.R, p.Stroke.G, p.Stroke.B, p.Stroke.A}), image.Point{})
}

var (
	fontsOnce sync.Once
	fonts     [2]*opentype.Font
	fontsErr  error
)

// face is the Go font (regular or bold) at size pixels.
func (r raster) face(size float64, bold bool) (font.Face, error) {
	fontsOnce.Do(func() {
		for i, ttf := range [][]byte{goregular.TTF, gobold.TTF} {
			if fonts[i], fontsErr = opentype.Parse(ttf); fontsErr != nil {
				return
			}
		}
	})
	if fontsErr != nil {
		return nil, fmt.Errorf("parse the Go font: %w", fontsErr)
	}
	k, i := [2]float64{size, 0}, 0
	if bold {
		k[1], i = 1, 1
	}
	if f, ok := r.faces[k]; ok {
		return f, nil
	}
	f, err := opentype.NewFace(fonts[i], &opentype.FaceOptions{Size: size, DPI: 72, Hinting: font.HintingFull})
	if err != nil {
		return nil, fmt.Errorf("font face %v px: %w", size, err)
	}
	r.faces[k] = f
	return f, nil
}
