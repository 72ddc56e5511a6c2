"""Detection ops: IoU family (IoU, GIoU, DIoU, CIoU + backward), box coders, rotated boxes, NMS variants, RoI align / PS-RoI pooling, YOLO targets, grid assignment, random choice with mask."""
