"""Routes: health."""

from fastapi import APIRouter

router = APIRouter()
