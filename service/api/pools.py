"""Routes: pools."""

from fastapi import APIRouter

router = APIRouter()
