"""Routes: checkpoints."""

from fastapi import APIRouter

router = APIRouter()
